"""Fused linear cross-entropy (LCE): the LM head and the loss without the (tokens x vocab) logits.

Loop over chunks of C tokens; for each chunk:
    logits = h_c @ W.T                 (C, V) fp32, a cuBLAS GEMM accumulating in fp32
    Triton: per row, the log-sum-exp (online, per lane, one read) and then, on a second read,
            the gradient softmax - onehot, times 1/n_valid, written over the logits in place
            (in the input dtype: bf16 rows fill the first half of each fp32 row)
    d(h_c) = G @ W                     (C, H)
    d(W)  += G.T @ h_c                 (V, H), accumulated in fp32 across chunks
so the forward computes both gradients and the backward only scales them by grad_output.
Ignored tokens (label == ignore_index) get zero loss and zero gradient; "mean" divides by the
number of non-ignored tokens (nan loss and zero gradients when there are none, as torch does).
Nothing waits for the host: the token count stays on the device.
"""

import functools

import torch
import triton
import triton.language as tl

from kernels import reference
from kernels._common import log, use_triton

LCE_CHUNK_BUDGET_BYTES = 1 << 30  # the chunk's fp32 logits; see lce_chunk_size
BLOCK_V = 4096  # vocab entries per step of the row kernel
ROW_WARPS = 16  # 16 warps x 32 threads x 8 fp32 = BLOCK_V
# "minus infinity" that keeps exp(m - m) finite in lanes that never saw a logit
_NEG = tl.constexpr(-3.0e38)


@triton.jit
def _lce_rows_kernel(
    logits_ptr, grad_ptr, labels_ptr, loss_ptr, scale_ptr, V, logits_stride, grad_stride,
    ignore_index, BLOCK_V: tl.constexpr, ALIASED: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    label = tl.load(labels_ptr + row)
    logits_row = logits_ptr + row * logits_stride
    grad_row = grad_ptr + row * grad_stride
    offs = tl.arange(0, BLOCK_V)
    if label == ignore_index:
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            tl.store(grad_row + cols, tl.zeros([BLOCK_V], grad_ptr.dtype.element_ty), mask=cols < V)
        tl.store(loss_ptr + row, 0.0)
    else:
        # pass 1: per-lane running max and rescaled sum, reduced once at the end
        m = tl.full([BLOCK_V], _NEG, tl.float32)
        acc = tl.zeros([BLOCK_V], tl.float32)
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            x = tl.load(logits_row + cols, mask=cols < V, other=_NEG).to(tl.float32)
            m_new = tl.maximum(m, x)
            acc = acc * tl.exp(m - m_new) + tl.exp(x - m_new)
            m = m_new
        m_row = tl.max(m, axis=0)
        lse = m_row + tl.log(tl.sum(acc * tl.exp(m - m_row), axis=0))
        target = tl.load(logits_row + label, mask=(label >= 0) & (label < V), other=0.0)
        tl.store(loss_ptr + row, lse - target.to(tl.float32))
        # pass 2: gradient of the (scaled) loss w.r.t. the logits, over the logits
        scale = tl.load(scale_ptr)
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            x = tl.load(logits_row + cols, mask=cols < V, other=0.0).to(tl.float32)
            if ALIASED:
                # 16-bit grads over fp32 logits: the bytes stored in step j hold logits of step
                # j // 2, read by other warps; all reads up to step j finish before any store
                tl.debug_barrier()
            g = tl.exp(x - lse) - tl.where(cols == label, 1.0, 0.0)
            tl.store(grad_row + cols, (g * scale).to(grad_ptr.dtype.element_ty), mask=cols < V)


def lce_chunk_size(n_tokens: int, vocab: int, budget_bytes: int = LCE_CHUNK_BUDGET_BYTES) -> int:
    """Tokens per chunk so that one chunk's fp32 logits (C x V x 4 bytes) fit in budget_bytes.

    Bytes alive during the forward (T tokens, hidden H, vocab V, bf16 inputs):
        chunk logits, gradient written over them   C x V x 4        <- the only term in C
        d(weight) fp32 accumulator                 V x H x 4        (then V x H x 2 in bf16)
        d(hidden)                                  T x H x 2
    against torch eager's ~T x V x 12 (fp32 log-softmax and two fp32 (T, V) gradients at once).
    Llama 3 (V = 128256, H = 4096): C x V x 4 = C x 0.49 MiB, so 1 GiB gives C = 2048; the peak
    is 3 GiB (chunk + accumulator, later accumulator + bf16 copy) + T x 8 KiB at any T, where
    eager needs ~1.4 MiB per token (measured on an H200: 3.00 GiB vs 11.7 GiB at T = 8192).
    Larger C keeps the GEMMs big: the d(weight) GEMM reads and writes its fp32 accumulator
    (8 V H bytes) once per chunk for 2 C V H FLOPs, C / 4 FLOP per byte (H200 ridge ~200).
    Rounded down to a multiple of 128 (the GEMM tile), at least 128, at most n_tokens.
    """
    chunk = max(128, budget_bytes // (vocab * 4) // 128 * 128)
    return max(1, min(chunk, n_tokens))


@functools.cache
def _addmm_fp32_out_works(device_type: str) -> bool:
    """Whether torch.addmm can add a bf16 x bf16 product into an fp32 tensor in place."""
    try:
        acc = torch.zeros(2, 2, device=device_type)
        a = torch.ones(2, 2, dtype=torch.bfloat16, device=device_type)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
        return bool(acc.eq(2).all())
    except (RuntimeError, TypeError) as exc:
        log.warning("kernels.lce: addmm(out_dtype=float32) unavailable (%s); slower path", exc)
        return False


def _mm_fp32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out (fp32) = a @ b, accumulating in fp32 whatever the input dtype."""
    if a.dtype == torch.float32:
        torch.mm(a, b, out=out)
    else:
        torch.mm(a, b, out_dtype=torch.float32, out=out)


def _addmm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, first: bool) -> None:
    """acc (fp32) += a @ b, or acc = a @ b if first (acc may then hold garbage)."""
    beta = 0.0 if first else 1.0
    if a.dtype == torch.float32:
        acc.addmm_(a, b, beta=beta)
    elif _addmm_fp32_out_works(acc.device.type):
        torch.addmm(acc, a, b, out_dtype=torch.float32, beta=beta, out=acc)
    else:  # slabs of 8192 rows keep the fp32 temporary small
        for s in range(0, acc.shape[0], 8192):
            part = torch.mm(a[s : s + 8192], b, out_dtype=torch.float32)
            acc[s : s + 8192] = part if first else acc[s : s + 8192] + part


def lce_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
    need_grad_hidden: bool = True,
    need_grad_weight: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """-> (loss fp32 scalar, d loss / d hidden, d loss / d weight), gradients for grad_output = 1."""
    n_tokens, _ = hidden.shape
    vocab = weight.shape[0]
    chunk = chunk_size or lce_chunk_size(n_tokens, vocab)
    logits_buf = torch.empty(
        (min(chunk, n_tokens), vocab), dtype=torch.float32, device=hidden.device
    )
    aliased = hidden.dtype != torch.float32
    # the gradient, in the input dtype, over the logits: (C, V) with row stride 2V for 16-bit
    grad_buf = logits_buf.view(hidden.dtype)[:, :vocab] if aliased else logits_buf
    n_valid = (labels != ignore_index).sum()
    if reduction == "mean":
        scale = 1.0 / n_valid.clamp(min=1).to(torch.float32)
    else:
        scale = torch.ones((), dtype=torch.float32, device=hidden.device)
    losses = torch.empty(n_tokens, dtype=torch.float32, device=hidden.device)
    grad_hidden = None
    if need_grad_hidden:
        grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
    grad_w_acc = None
    if need_grad_weight:
        grad_w_acc = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    for start in range(0, n_tokens, chunk):
        end = min(start + chunk, n_tokens)
        h = hidden[start:end]  # (c, H)
        logits, grad = logits_buf[: end - start], grad_buf[: end - start]
        _mm_fp32(h, weight.T, out=logits)  # (c, V) = (c, H) @ (H, V)
        _lce_rows_kernel[(end - start,)](
            logits, grad, labels[start:end], losses[start:end], scale, vocab,
            logits.stride(0), grad.stride(0), ignore_index,
            BLOCK_V=BLOCK_V, ALIASED=aliased, num_warps=ROW_WARPS,
        )  # fmt: skip
        if grad_hidden is not None:
            torch.mm(grad, weight, out=grad_hidden[start:end])  # (c, H) = (c, V) @ (V, H)
        if grad_w_acc is not None:
            _addmm_fp32(grad_w_acc, grad.T, h, first=start == 0)  # (V, H) += (V, c) @ (c, H)
    del logits_buf, grad_buf, logits, grad
    loss = losses.sum()
    if reduction == "mean":
        loss = loss / n_valid
    grad_weight = None if grad_w_acc is None else grad_w_acc.to(weight.dtype)
    return loss, grad_hidden, grad_weight


class LinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, ignore_index, reduction, chunk_size):
        loss, grad_hidden, grad_weight = lce_forward(
            hidden, weight, labels, ignore_index=ignore_index, reduction=reduction,
            chunk_size=chunk_size, need_grad_hidden=ctx.needs_input_grad[0],
            need_grad_weight=ctx.needs_input_grad[1],
        )  # fmt: skip
        # held on ctx, not saved: the backward hands these very tensors on, scaled in place
        ctx.grads = (grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.grads is None:
            raise RuntimeError("fused_linear_cross_entropy: backward can run only once per forward")
        grads, ctx.grads = ctx.grads, None
        grad_hidden, grad_weight = (
            None if g is None else g.mul_(grad_output.to(g.dtype)) for g in grads
        )
        return grad_hidden, grad_weight, None, None, None, None


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of hidden (T, H) @ weight (V, H).T against labels (T,), never storing (T, V).

    Returns an fp32 scalar; differentiable in hidden and weight (which may be tied to an
    embedding). chunk_size overrides lce_chunk_size (tests use it to force many chunks).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"fused_linear_cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}"
        )
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"fused_linear_cross_entropy: need hidden (T, H) and weight (V, H), got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if labels.shape != hidden.shape[:1] or hidden.dtype != weight.dtype:
        raise ValueError(
            f"fused_linear_cross_entropy: labels must be (T,) = ({hidden.shape[0]},) and "
            f"hidden/weight one dtype; got {tuple(labels.shape)}, {hidden.dtype}/{weight.dtype}"
        )
    if not use_triton("fused_linear_cross_entropy", hidden, weight):
        return reference.linear_cross_entropy(
            hidden, weight, labels, ignore_index=ignore_index, reduction=reduction
        )
    return LinearCrossEntropyFunction.apply(
        hidden, weight, labels.contiguous(), ignore_index, reduction, chunk_size
    )
