"""Slide: layer-sliding full fine-tuning on one GPU. The public API lives in `slide.api`."""
