"""The one place that picks kernels: Triton (package `slide_kernels`) for CUDA tensors, the pure-torch
references (`slide_kernels.reference`) for CPU tensors.

Why not let `slide_kernels` decide: under TRITON_INTERPRET=1 (set by the test suite on CPU machines)
it would run float32 CPU tensors through the Triton interpreter, far too slow to train with.
`SLIDE_KERNELS=torch` forces the references on CUDA as well (debugging).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import slide_kernels
from executor import knobs
from slide_kernels import reference

_FORCE_TORCH = knobs.from_env().torch_kernels
# Grouped linears (q|k|v, gate|up) as one GEMM on CPU too. Off: CPU runs then reproduce
# transformers' rounding (one GEMM per projection), which keeps the CPU parity tests far from
# their tolerance; tests switch it on to check the fused form as well.
FUSE_ON_CPU = False


def _triton(t: torch.Tensor) -> bool:
    return t.is_cuda and not _FORCE_TORCH


def one_pass_adamw(master: torch.Tensor) -> bool:
    """Whether a device update of `master` runs `slide_kernels.adamw_step` (else torch's fused
    AdamW on an FP32 gradient: the CPU executor, whose runs match plain PyTorch bit for bit)."""
    return _triton(master)


def grouped_linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, sizes: tuple[int, ...]
) -> torch.Tensor:
    """x @ w.T + b for a weight made of row blocks of `sizes`: one GEMM on CUDA (fewer, larger
    kernels), one per block on CPU unless FUSE_ON_CPU."""
    if x.is_cuda or FUSE_ON_CPU:
        return F.linear(x, w, b)
    bs = b.split(sizes) if b is not None else (None,) * len(sizes)
    return torch.cat([F.linear(x, wi, bi) for wi, bi in zip(w.split(sizes), bs, strict=True)], -1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    impl = slide_kernels.rms_norm if _triton(x) else reference.rms_norm
    return impl(x, weight, eps)


def swiglu_gate_up(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the fused gate|up projection's output (..., 2I), read in place."""
    impl = slide_kernels.swiglu_gate_up if _triton(gate_up) else reference.swiglu_gate_up
    return impl(gate_up)


def swiglu_gate_up_backward(gate_up: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """d(gate|up) (..., 2I) of `swiglu_gate_up` under dy, with no recorded forward: the
    kernel's backward, or autograd through the reference (on the CPU the gradient a recorded
    reference gives, bit for bit)."""
    if _triton(gate_up):
        return slide_kernels.swiglu_gate_up_backward(gate_up, dy)
    leaf = gate_up.detach().requires_grad_()
    with torch.enable_grad():
        product = reference.swiglu_gate_up(leaf)
    (grad,) = torch.autograd.grad(product, leaf, dy)
    return grad


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return (slide_kernels.rope if _triton(q) else reference.rope)(q, k, cos, sin)


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, chunk: int | None
) -> torch.Tensor:
    """Sum (not mean) of the token losses of hidden (T, H) @ weight (V, H).T; the caller scales
    by 1 / (valid tokens of the whole step), so micro-batches add up to the step's mean."""
    if _triton(hidden):
        return slide_kernels.fused_linear_cross_entropy(
            hidden, weight, labels, reduction="sum", chunk_size=chunk
        )
    return reference.linear_cross_entropy(hidden, weight, labels, reduction="sum")
