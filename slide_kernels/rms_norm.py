"""RMSNorm over the last dim, Llama/Qwen convention, forward and backward (weight gradient too).

    y = weight * (x * rstd).to(x.dtype),   rstd = 1 / sqrt(mean(x^2) + eps), computed in fp32

Qwen3's per-head q/k norm is the same op with last dim = head_dim. A program owns a tile of
BLOCK_M rows x BLOCK_N (>= N) columns, so short rows (head_dim 128) are batched and long ones
(hidden 4096) take a row each. The forward saves rstd (one fp32 per row). The backward gives each
of ~BWD_PER_SM programs per SM a contiguous run of rows, walked BWD_TILE elements (>= one row) at
a time; the program sums d(weight) over its rows in fp32 registers and writes one fp32 partial
row, and torch sums the partials (programs x N x 4 bytes: ~4 MiB at N = 4096 on an H200).
"""

import torch
import triton
import triton.language as tl

from slide_kernels import reference
from slide_kernels._common import next_power_of_2, num_programs_cap, num_warps_for, use_triton

MAX_N = 65536  # one row must fit in a tile
INT32_OFFSETS_BELOW = 2**31  # the forward's offsets are int32 below this many elements, else int64
TILE = 4096  # elements per program tile (BLOCK_M x BLOCK_N), at least one row
ELEMS_PER_THREAD = 16  # num_warps = tile / (32 x this), 1 to 16
# backward launch (set from `python -m bench.kernels.speed --sweep`, rms_norm bwd rows)
BWD_TILE = 8192  # elements per loop step: 2 rows of 4096
BWD_ELEMS_PER_THREAD = 16  # num_warps = tile / (32 x this), 1 to 16 (so 16 warps here)
BWD_PER_SM = 1  # programs per SM, each with its partial d(weight) row
# loads of the next row blocks issued while this one computes (H200, N = 4096: 116.5 us at 3
# stages against 145.4 at 1; 123.8 for the best unpipelined setting, a 16384 tile)
BWD_STAGES = 3


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, N, x_stride, y_stride, eps, zero,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_ROWS: tl.constexpr, OFFSETS_32: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    mask = (cols < N)[None, :]
    if not EVEN_ROWS:  # only the last tile can hold rows past the end
        mask = row_mask[:, None] & mask
    # int32 address arithmetic where every offset of x and y fits (H200, 16384 x 4096 bf16: 0.1 us
    # faster than int64, paired against liger, 2026-11-30)
    row_offsets = rows[:, None] if OFFSETS_32 else rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + row_offsets * x_stride + cols[None, :], mask=mask, other=0.0)
    # `zero` is a runtime 0.0. Adding it gives the weight a use the compiler cannot fold and that
    # does not wait on the reduction, so the weight loads issue with x's; without it they sink
    # below the rsqrt and their latency sits between the reduction and the stores (SASS, H200:
    # 16384 x 4096 bf16 in 64.5 us against 65.0, 2026-11-30).
    w = zero + tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / N + eps)  # (BLOCK_M,)
    normed = (xf * rstd[:, None]).to(x.dtype)  # cast back before the weight, as Llama does
    y = normed.to(tl.float32) * w[None, :]
    tl.store(
        y_ptr + row_offsets * y_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask
    )
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, n_rows, N, blocks_per_program,
    dy_stride, x_stride, dx_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    first = pid * blocks_per_program
    last = tl.minimum(first + blocks_per_program, tl.cdiv(n_rows, BLOCK_M))
    for block in tl.range(first, last, num_stages=STAGES):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        dy = tl.load(dy_ptr + rows64 * dy_stride + cols[None, :], mask=mask, other=0.0)
        x = tl.load(x_ptr + rows64 * x_stride + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        dy = dy.to(tl.float32)
        x_hat = x.to(tl.float32) * rstd[:, None]
        d_hat = dy * w[None, :]  # d loss / d normed (the cast back is taken as identity)
        mean_dot = tl.sum(d_hat * x_hat, axis=1) / N  # (BLOCK_M,)
        dx = (d_hat - x_hat * mean_dot[:, None]) * rstd[:, None]
        tl.store(
            dx_ptr + rows64 * dx_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask
        )
        dw_acc += tl.sum(dy * x_hat, axis=0)  # (BLOCK_N,): masked rows add zeros
    tl.store(dw_partial_ptr + pid * N + cols, dw_acc, mask=col_mask)


def _tile(n: int, tile: int, elems_per_thread: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for rows of n elements."""
    block_n = next_power_of_2(n)
    block_m = max(1, tile // block_n)
    return block_m, block_n, num_warps_for(block_m * block_n, elems_per_thread)


def rms_norm_forward(
    x2d: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x2d (rows, N) with unit column stride -> (y (rows, N), rstd (rows,) fp32)."""
    n_rows, n = x2d.shape
    out_dtype = torch.promote_types(x2d.dtype, weight.dtype)  # as `weight * normed` in torch
    y = torch.empty((n_rows, n), dtype=out_dtype, device=x2d.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x2d.device)
    block_m, block_n, warps = _tile(n, TILE, ELEMS_PER_THREAD)
    _rms_norm_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
        x2d, weight, y, rstd, n_rows, n, x2d.stride(0), y.stride(0), eps, 0.0,
        BLOCK_M=block_m, BLOCK_N=block_n, EVEN_ROWS=n_rows % block_m == 0,
        OFFSETS_32=max(x2d.stride(0), y.stride(0)) * n_rows < INT32_OFFSETS_BELOW, num_warps=warps,
    )  # fmt: skip
    return y, rstd


def rms_norm_backward(
    dy: torch.Tensor, x2d: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (dx (rows, N) in x's dtype, dweight (N,) in weight's dtype)."""
    n_rows, n = x2d.shape
    block_m, block_n, warps = _tile(n, BWD_TILE, BWD_ELEMS_PER_THREAD)
    n_blocks = triton.cdiv(n_rows, block_m)
    per_program = triton.cdiv(n_blocks, num_programs_cap(x2d.device, BWD_PER_SM))
    programs = max(1, triton.cdiv(n_blocks, per_program))
    dx = torch.empty_like(x2d)
    dw_partial = torch.empty((programs, n), dtype=torch.float32, device=x2d.device)
    _rms_norm_bwd_kernel[(programs,)](
        dy, x2d, weight, rstd, dx, dw_partial, n_rows, n, per_program,
        dy.stride(0), x2d.stride(0), dx.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, STAGES=BWD_STAGES, num_warps=warps,
    )  # fmt: skip
    return dx, dw_partial.sum(0).to(weight.dtype)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """View (..., N) as (rows, N) with unit column stride, copying only if it must."""
    t2d = t.reshape(-1, t.shape[-1])
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2d = _rows(x)
        y, rstd = rms_norm_forward(x2d, weight, eps)
        ctx.save_for_backward(x2d, weight, rstd)
        ctx.x_dtype = x.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x2d, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(_rows(dy), x2d, weight, rstd)
        return dx.view(dy.shape), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x (..., N) with weight (N,); differentiable in x and weight."""
    if weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"rms_norm: weight must be (N,) with N = x.shape[-1], got {tuple(weight.shape)} "
            f"for x {tuple(x.shape)}"
        )
    if x.shape[-1] > MAX_N:
        raise ValueError(f"rms_norm: last dim must be <= {MAX_N}, got {x.shape[-1]}")
    if not use_triton("rms_norm", x, weight):
        return reference.rms_norm(x, weight, eps)
    return RMSNormFunction.apply(x, weight, eps)
