"""slide."""
