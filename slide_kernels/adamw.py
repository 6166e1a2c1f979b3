"""AdamW of one flat parameter range in one pass: gradient (any float dtype) read once, FP32
master and moments (FP32 or BF16) read and written once, the compute-dtype weights written from
the new master in the same pass.

torch's fused AdamW needs FP32 gradients and moments and writes only the master, so a device
update built on it upcasts the gradient into a temporary, scales it for clipping in another
pass and copies the master into the weights in a third: 40-52 B/param where this kernel moves
28 (BF16 gradient, FP32 state, BF16 weights). The update is torch's AdamW (decoupled decay
as `p *= 1 - lr * wd`, then `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g g`,
`p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)`), in FP32; it agrees with torch's to a few
ulp, not bitwise (the decay factor and the bias corrections are rounded on the host here).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK = 2048  # elements per program
WARPS = 8


@triton.jit
def _adamw_kernel(
    master_ptr, grad_ptr, m_ptr, v_ptr, weights_ptr, coef_ptr, n,
    grad_scale, lr, decay_factor, beta1, beta2, step_size, bc2_sqrt, eps,
    HAS_COEF: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_COEF:
        g = g * tl.load(coef_ptr)
    g = g * grad_scale
    p = tl.load(master_ptr + offs, mask=mask, other=0.0)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    p = p * decay_factor
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / bc2_sqrt + eps)
    tl.store(master_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)
    tl.store(weights_ptr + offs, p.to(weights_ptr.dtype.element_ty), mask=mask)


def adamw_step(
    master: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    weights: torch.Tensor,
    *,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    coef: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> None:
    """One AdamW step in place on flat contiguous tensors of one length: `master` (FP32), `m`
    and `v` (FP32 or BF16), `weights` (any float dtype: the new master cast into it). The
    gradient is multiplied by `coef` (a 0-d FP32 tensor on the device: a clipping coefficient
    the host never reads) and then by `grad_scale`. `step` counts from 1."""
    n = master.numel()
    for name, t in (("grad", grad), ("m", m), ("v", v), ("weights", weights)):
        if t.numel() != n or not t.is_contiguous():
            raise ValueError(
                f"adamw_step: {name} must be contiguous with {n} elements like master, got "
                f"{t.numel()} (contiguous: {t.is_contiguous()})"
            )
    if master.dtype != torch.float32 or step < 1:
        raise ValueError(f"adamw_step: master must be float32 and step >= 1, got "
                         f"{master.dtype} and step {step}")  # fmt: skip
    if n == 0:
        return
    b1, b2 = betas
    _adamw_kernel[(triton.cdiv(n, BLOCK),)](
        master, grad, m, v, weights, coef if coef is not None else master, n,
        grad_scale, lr, 1.0 - lr * weight_decay, b1, b2,
        lr / (1.0 - b1**step), math.sqrt(1.0 - b2**step), eps,
        HAS_COEF=coef is not None, BLOCK=BLOCK, num_warps=WARPS,
    )  # fmt: skip
