"""Rotary position embedding on q and k, HF `rotate_half` layout, forward and backward.

    out = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]

q (batch, q_heads, seq, head_dim) and k (batch, kv_heads, seq, head_dim), any strides with a unit
last stride (HF's transposed projections are views); cos and sin (seq, head_dim) or
(batch or 1, seq, head_dim), e.g. from `slide_kernels.rope_freqs.rope_cos_sin`. One program per token
(b, s) loads that token's cos/sin once and rotates all its q and k heads. The map is linear and
orthogonal, so the backward is the same kernel with sin's halves swapped and negated:
    dx1 = dy1 * cos1 + dy2 * sin2,   dx2 = dy2 * cos2 - dy1 * sin1.
"""

import torch
import triton
import triton.language as tl

from slide_kernels import reference
from slide_kernels._common import next_power_of_2, num_warps_for, use_triton

ELEMS_PER_THREAD = 32  # per tensor half: num_warps = 2 x heads x head_dim / 2 / (32 x this);
# 32 gives 4 warps for 32 q heads of 128, the H200 sweep's best (89.0 us vs 91.6 at 16, 8 warps)


@triton.jit
def _rotate_heads(
    x_ptr, o_ptr, b, s, x_sb, x_sh, x_ss, o_sb, o_sh, o_ss, n_heads, half, c1, c2, s1, s2,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    heads = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < n_heads) & (d < half)
    x_row = x_ptr + b * x_sb + s * x_ss + heads * x_sh + d
    o_row = o_ptr + b * o_sb + s * o_ss + heads * o_sh + d
    x1 = tl.load(x_row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + half, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * c1 - x2 * s1
    y2 = x2 * c2 + x1 * s2
    tl.store(o_row, y1.to(o_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + half, y2.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, seq, n_qh, n_kh, half,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, cs_sb, cs_ss,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_D: tl.constexpr, BACKWARD: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b = (pid // seq).to(tl.int64)
    s = (pid % seq).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    d_mask = d < half
    cs_row = b * cs_sb + s * cs_ss + d
    c1 = tl.load(cos_ptr + cs_row, mask=d_mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + cs_row + half, mask=d_mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + cs_row, mask=d_mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + cs_row + half, mask=d_mask, other=0.0).to(tl.float32)
    if BACKWARD:  # transpose of the rotation: swap and negate sin's halves
        s1, s2 = -s2, -s1
    _rotate_heads(
        q_ptr, qo_ptr, b, s, q_sb, q_sh, q_ss, qo_sb, qo_sh, qo_ss, n_qh, half, c1, c2, s1, s2,
        BLOCK_QH, BLOCK_D,
    )  # fmt: skip
    _rotate_heads(
        k_ptr, ko_ptr, b, s, k_sb, k_sh, k_ss, ko_sb, ko_sh, ko_ss, n_kh, half, c1, c2, s1, s2,
        BLOCK_KH, BLOCK_D,
    )  # fmt: skip


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _cos_sin_3d(t: torch.Tensor) -> torch.Tensor:
    """(seq, d) or (batch|1, seq, d) -> a 3-D view with unit last stride."""
    return _unit_last(t if t.dim() == 3 else t.unsqueeze(0))


def rope_apply(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (or, with backward=True, their gradients) into new tensors of their strides."""
    q, k = _unit_last(q), _unit_last(k)
    cos, sin = _cos_sin_3d(cos), _cos_sin_3d(sin)
    batch, n_qh, seq, head_dim = q.shape
    n_kh = k.shape[1]
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)  # same strides for dense inputs
    cs_sb = 0 if cos.shape[0] == 1 else cos.stride(0)
    half = head_dim // 2
    block_qh, block_kh, block_d = (
        next_power_of_2(n_qh),
        next_power_of_2(n_kh),
        next_power_of_2(half),
    )
    _rope_kernel[(batch * seq,)](
        q, k, q_out, k_out, cos, sin, seq, n_qh, n_kh, half,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2),
        k_out.stride(0), k_out.stride(1), k_out.stride(2), cs_sb, cos.stride(1),
        BLOCK_QH=block_qh, BLOCK_KH=block_kh, BLOCK_D=block_d, BACKWARD=backward,
        num_warps=num_warps_for(2 * block_qh * block_d, ELEMS_PER_THREAD),
    )  # fmt: skip
    return q_out, k_out


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope_apply(q, k, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq_in, dk_in = rope_apply(dq, dk, cos, sin, backward=True)
        return dq_in, dk_in, None, None


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"rope: q and k must be (batch, heads, seq, head_dim), got {q.shape} {k.shape}"
        )
    batch, _, seq, head_dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, head_dim) or head_dim % 2:
        raise ValueError(
            f"rope: q {tuple(q.shape)} and k {tuple(k.shape)} disagree (or odd head_dim)"
        )
    if cos.shape != sin.shape or cos.dim() not in (2, 3) or cos.shape[-2:] != (seq, head_dim):
        raise ValueError(f"rope: cos/sin must be (seq, d) or (b, seq, d), got {tuple(cos.shape)}")
    if cos.dim() == 3 and cos.shape[0] not in (1, batch):
        raise ValueError(f"rope: cos batch {cos.shape[0]} is neither 1 nor {batch}")


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by cos/sin, out of place; differentiable in q and k (not cos, sin)."""
    _check(q, k, cos, sin)
    if not use_triton("rope", q, k, cos, sin):
        return reference.rope(q, k, cos, sin)
    return RoPEFunction.apply(q, k, cos, sin)
