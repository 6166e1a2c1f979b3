"""slide_ir."""
