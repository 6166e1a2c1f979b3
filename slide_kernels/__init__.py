"""Triton kernels for Slide's layers: fused linear cross-entropy, RMSNorm, RoPE, SwiGLU, and the
one-pass AdamW of a device update.

Each op is one module with its Triton kernels, launchers, an autograd Function and one public
function; `slide_kernels.reference` holds the pure-torch equivalents (test gold, benchmark baseline, and
the fallback where Triton cannot run). Knows nothing of schedules.
"""

from slide_kernels.rope_freqs import rope_cos_sin, rope_inv_freq

try:
    from slide_kernels.adamw import adamw_step
    from slide_kernels.lce import fused_linear_cross_entropy
    from slide_kernels.rms_norm import rms_norm
    from slide_kernels.rope import rope
    from slide_kernels.swiglu import swiglu, swiglu_gate_up, swiglu_gate_up_backward
except ImportError as exc:  # no triton: every op is its pure-torch reference
    if getattr(exc, "name", None) != "triton":
        raise
    from slide_kernels._common import log
    from slide_kernels.reference import linear_cross_entropy as fused_linear_cross_entropy
    from slide_kernels.reference import rms_norm, rope, swiglu, swiglu_gate_up

    log.info("kernels: triton is not installed; using the pure-torch references")


__all__ = [
    "adamw_step",
    "fused_linear_cross_entropy",
    "rms_norm",
    "rope",
    "rope_cos_sin",
    "rope_inv_freq",
    "swiglu",
    "swiglu_gate_up",
    "swiglu_gate_up_backward",
]
