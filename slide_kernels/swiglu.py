"""SwiGLU, silu(gate) * up, fused forward and backward.

Elementwise and memory-bound: the forward reads gate and up and writes the product (3 passes over
the data), the backward reads dy, gate and up and writes d(gate) and d(up) (5 passes), recomputing
sigmoid(gate) instead of saving it. All arithmetic in fp32, stored in the input dtype.

gate and up are read in place as rows of one stride, so the two halves of the fused gate|up
projection's output (B, S, 2I) need no copies: `swiglu_gate_up` takes that tensor whole, saves
it for the backward and writes d(gate|up) into one (B, S, 2I) gradient. The product and dy are
contiguous.
"""

import torch
import triton
import triton.language as tl

from slide_kernels import reference
from slide_kernels._common import use_triton

BLOCK = 2048  # elements per program
WARPS = 8  # 8 warps x 32 threads x 8 bf16 (one 16-byte access per tensor per thread)


@triton.jit
def _offsets(width, stride, BLOCK: tl.constexpr):
    """Program (row, column block)'s columns: their offsets in the contiguous product, in the
    operands' rows of `stride` elements, and the mask of those inside the row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    return row * width + cols, row * stride + cols, cols < width


@triton.jit
def _swiglu_fwd_kernel(gate_ptr, up_ptr, out_ptr, width, stride, BLOCK: tl.constexpr):
    offs, at, mask = _offsets(width, stride, BLOCK)
    g = tl.load(gate_ptr + at, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + at, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, width, stride, BLOCK: tl.constexpr
):
    offs, at, mask = _offsets(width, stride, BLOCK)  # gate, up and their gradients: `at`
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + at, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + at, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = g * sig
    # d silu(g) / dg = sig * (1 + g * (1 - sig))
    dg = dy * u * sig * (1.0 + g * (1.0 - sig))
    tl.store(dgate_ptr + at, dg.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + at, (dy * silu).to(dup_ptr.dtype.element_ty), mask=mask)


def _grid(t: torch.Tensor) -> tuple[int, int]:
    """One program per (row, BLOCK columns) of t's last dim."""
    width = t.shape[-1]
    return t.numel() // width if width else 0, triton.cdiv(width, BLOCK)


def _row_stride(t: torch.Tensor) -> int | None:
    """The stride between t's rows (last dim) if t is rows of one stride with unit steps, else
    None: a contiguous tensor, or a last-dim slice of one."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return None
    width = t.shape[-1]
    stride = t.stride(-2) if t.dim() > 1 else width
    span = stride
    for d in range(t.dim() - 2, -1, -1):  # each leading dim steps over the rows inside it
        if t.shape[d] > 1 and t.stride(d) != span:
            return None
        span *= t.shape[d]
    return stride if stride >= width else None


def _rows(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """gate and up as rows of one stride (copies only where they are not), and that stride."""
    stride = _row_stride(gate)
    if stride is None or _row_stride(up) != stride:
        gate, up = gate.contiguous(), up.contiguous()
        stride = gate.shape[-1]
    return gate, up, stride


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate, up, stride = _rows(gate, up)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel():
        _swiglu_fwd_kernel[_grid(out)](
            gate, up, out, gate.shape[-1], stride, BLOCK=BLOCK, num_warps=WARPS
        )
    return out


def swiglu_backward(
    dy: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    dgate: torch.Tensor | None = None,
    dup: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """d(gate), d(up) of the upstream dy (the product's shape), into `dgate` and `dup` when given
    (laid out as gate and up: e.g. the halves of one packed gradient), else into new contiguous
    tensors (gate and up then read from contiguous copies where they are strided)."""
    if dgate is None or dup is None:
        gate, up = gate.contiguous(), up.contiguous()
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    stride = _row_stride(gate)
    if stride is None or any(_row_stride(t) != stride for t in (up, dgate, dup)):
        raise ValueError("swiglu_backward: gate, up and their gradients must share one row layout")
    if dy.numel():
        _swiglu_bwd_kernel[_grid(dy)](
            dy.contiguous(), gate, up, dgate, dup, gate.shape[-1], stride,
            BLOCK=BLOCK, num_warps=WARPS,
        )  # fmt: skip
    return dgate, dup


def _halves(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return gate_up.chunk(2, dim=-1)


def swiglu_gate_up_backward(gate_up: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """d(gate|up) (..., 2I) of silu(gate) * up under the upstream dy (..., I)."""
    grad = torch.empty_like(gate_up)
    swiglu_backward(dy, *_halves(gate_up), *_halves(grad))
    return grad


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return swiglu_forward(gate, up)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        return swiglu_backward(dy, gate, up)


class SwiGLUGateUpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate_up)
        return swiglu_forward(*_halves(gate_up))

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> torch.Tensor:
        (gate_up,) = ctx.saved_tensors
        return swiglu_gate_up_backward(gate_up, dy)


def _check(gate: torch.Tensor, up: torch.Tensor) -> None:
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"swiglu: gate and up must match, got {tuple(gate.shape)} {gate.dtype} "
            f"and {tuple(up.shape)} {up.dtype}"
        )


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for two tensors of one shape and dtype; differentiable in both."""
    _check(gate, up)
    if not use_triton("swiglu", gate, up):
        return reference.swiglu(gate, up)
    return SwiGLUFunction.apply(gate, up)


def swiglu_gate_up(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused projection's output (..., 2I), gate its first half and up its
    second: (..., I), differentiable, its backward one (..., 2I) gradient."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu_gate_up: the last dim must be even, got {tuple(gate_up.shape)}")
    if not use_triton("swiglu", gate_up):
        return reference.swiglu_gate_up(gate_up)
    gate_up = gate_up if _row_stride(gate_up) is not None else gate_up.contiguous()
    return SwiGLUGateUpFunction.apply(gate_up)
