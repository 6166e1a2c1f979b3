"""SwiGLU, silu(gate) * up, fused forward and backward.

Elementwise and memory-bound: the forward reads gate and up and writes the product (3 passes over
the data), the backward reads dy, gate and up and writes d(gate) and d(up) (5 passes), recomputing
sigmoid(gate) instead of saving it. All arithmetic in fp32, stored in the input dtype.
"""

import torch
import triton
import triton.language as tl

from slide_kernels import reference
from slide_kernels._common import use_triton

BLOCK = 2048  # elements per program
WARPS = 8  # 8 warps x 32 threads x 8 bf16 (one 16-byte access per tensor per thread)


@triton.jit
def _swiglu_fwd_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    # d silu(g) / dg = sig * (1 + g * (1 - sig))
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))
    tl.store(dgate_ptr + offs, dg.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offs, (dy * silu).to(dup_ptr.dtype.element_ty), mask=mask)


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(gate)
    n = gate.numel()
    _swiglu_fwd_kernel[(triton.cdiv(n, BLOCK),)](gate, up, out, n, BLOCK=BLOCK, num_warps=WARPS)
    return out


def swiglu_backward(
    dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    n = gate.numel()
    _swiglu_bwd_kernel[(triton.cdiv(n, BLOCK),)](
        dy, gate, up, dgate, dup, n, BLOCK=BLOCK, num_warps=WARPS
    )
    return dgate, dup


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        return swiglu_forward(gate, up)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        return swiglu_backward(dy.contiguous(), gate, up)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for two tensors of one shape and dtype; differentiable in both."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"swiglu: gate and up must match, got {tuple(gate.shape)} {gate.dtype} "
            f"and {tuple(up.shape)} {up.dtype}"
        )
    if not use_triton("swiglu", gate, up):
        return reference.swiglu(gate, up)
    return SwiGLUFunction.apply(gate, up)
