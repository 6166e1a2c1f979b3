"""Fused linear cross-entropy (LCE): the LM head and the loss without the (tokens x vocab) logits.

Loop over chunks of C tokens (C = lce_chunk_size); for each chunk:
    logits = h_c @ W.T                 (C, V) cuBLAS GEMM, fp32 accumulation; stored in the input
                                       dtype (default) or in fp32 (logits_fp32=True)
    Triton: per row, upcast to fp32, the log-sum-exp (online, per lane, one read) and then, on a
            second read, the gradient softmax - onehot, times 1/n_valid, written over the logits
            in the input dtype (over fp32 logits, bf16 rows fill the first half of each fp32 row)
    d(h_c) = G @ W                     (C, H)
    d(W)  += G.T @ h_c                 (V, H), added into the returned gradient in W's dtype
                                       (default) or into an fp32 accumulator (accumulate_fp32=True)
so the forward computes both gradients and the backward only scales them by grad_output.
Ignored tokens (label == ignore_index) get zero loss and zero gradient; "mean" divides by the
number of non-ignored tokens (nan loss and zero gradients when there are none, as torch does).
Nothing waits for the host: the token count stays on the device.

Precision with bf16 inputs (defaults, as liger): the logits are rounded to bf16 once, exactly as
in torch's bf16 `h @ W.T` before its fp32 cross-entropy, so the loss and G carry the same error as
eager bf16's. d(W) is rounded to bf16 once per chunk instead of once in all (each addmm sums its
product in fp32, adds the bf16 running sum in fp32 and rounds): T / C roundings of partial sums,
a relative error ~sqrt(T / C / 2) x bf16's (about 4x at T / C = 32) where eager has ~1x. In
float32 (CPU tests) every option computes the same thing.
"""

import functools

import torch
import triton
import triton.language as tl

from slide_kernels import reference
from slide_kernels._common import log, use_triton

# Chunk policy (lce_chunk_size); the defaults are set from `python -m bench.kernels.speed --sweep`.
LCE_CHUNK_BUDGET_BYTES = 2 << 30  # cap on one chunk's logits: C x V x itemsize
LCE_CHUNK_EAGER_DIVISOR = 48  # and at most 1/48 of torch eager's peak (T x V x 12 bytes)
LOGITS_FP32 = False  # True: fp32 chunk logits for bf16 inputs (twice the bytes per token)
ACCUMULATE_FP32 = False  # True: d(weight) summed in an fp32 (V, H) buffer, cast at the end
BLOCK_V = 4096  # vocab entries per step of the row kernel
ROW_WARPS = 8  # 8 warps x 32 threads x 16 = BLOCK_V (the H200 sweep: 629 us vs 692 at 16 warps)
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
        # read before any warp can reach pass 2, which writes the gradient over the logits
        target = tl.load(logits_row + label, mask=(label >= 0) & (label < V), other=0.0)
        # pass 1: per-lane running max and rescaled sum, reduced once at the end
        m = tl.full([BLOCK_V], _NEG, tl.float32)
        acc = tl.zeros([BLOCK_V], tl.float32)
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            x = tl.load(logits_row + cols, mask=cols < V, other=_NEG).to(tl.float32)
            m_new = tl.maximum(m, x)
            acc = acc * tl.exp(m - m_new) + tl.exp(x - m_new)
            m = m_new
        m_row = tl.max(m, axis=0)  # a block-wide reduction: every warp has loaded `target`
        lse = m_row + tl.log(tl.sum(acc * tl.exp(m - m_row), axis=0))
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


def lce_chunk_size(
    n_tokens: int,
    vocab: int,
    logits_itemsize: int = 2,
    *,
    budget_bytes: int = LCE_CHUNK_BUDGET_BYTES,
    eager_divisor: int = LCE_CHUNK_EAGER_DIVISOR,
) -> int:
    """Tokens per chunk: one chunk's logits (C x V x logits_itemsize bytes) fit in budget_bytes
    and in 1 / eager_divisor of torch eager's peak (T x V x 12 bytes: bf16 logits, their fp32 upcast, the
    fp32 log-softmax gradient).

    Bytes alive during the forward (T tokens, hidden H, vocab V, bf16 inputs, the defaults):
        chunk logits, gradient written over them   C x V x 2        <- the only term in C
        d(weight), accumulated in place            V x H x 2        (returned: counts in the peak)
        d(hidden)                                  T x H x 2
    Llama 3 (V = 128256, H = 4096), divisor 48: C = T / 8 (C x V x 2 = T x V / 4 = 2% of eager's),
    capped by 2 GiB at C = 8192 from T = 65536 on. At T = 8192: C = 1024, peak 0.98 + 0.24 +
    0.06 = 1.29 GiB = 11% of eager's 11.74 (target 12%); the fixed V x H x 2 alone is 12% of
    eager's at T = 5700, so no chunk meets the target below that. Larger C keeps the GEMMs big:
    the d(weight) GEMM reads and writes its bf16 sum (4 V H bytes) once per chunk for 2 C V H
    FLOPs, C / 2 FLOP per byte (H200 ridge ~200, so C >= ~1024 hides it under the math). At
    T = 65536 on the H200 (2026-11-30), C = 8192 took 313.7-317.3 ms against 321.1-322.5 at
    C = 2048 (liger: 320.2-320.8); fewer chunks also mean fewer bf16 roundings of d(weight).
    Rounded down to a multiple of 128 (the GEMM tile), at least 128, at most n_tokens.
    """
    budget = min(budget_bytes, n_tokens * vocab * 12 // eager_divisor)
    chunk = max(128, budget // (vocab * logits_itemsize) // 128 * 128)
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
        log.warning(
            "slide_kernels.lce: addmm(out_dtype=float32) unavailable (%s); slower path", exc
        )
        return False


def _dense_on_cpu(a: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`a` itself on the GPU; a contiguous copy on the CPU (tests only), whose bf16 GEMM read
    past the row ends of a strided bf16 operand on a CI host (torch 2.13, oneDNN 3.12): the
    fp32 logits' bytes beside the bf16 gradient rows came back as NaN in d(hidden)."""
    return a if out.is_cuda else a.contiguous()


def _mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b in out's dtype, accumulating in fp32 whatever the input dtype."""
    a = _dense_on_cpu(a, out)
    if a.dtype == out.dtype:
        torch.mm(a, b, out=out)
    elif out.is_cuda:
        torch.mm(a, b, out_dtype=out.dtype, out=out)
    else:  # the CPU (bf16 tests only) has no mixed-dtype GEMM
        out.copy_(a.float() @ b.float())


def _addmm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, first: bool) -> None:
    """acc += a @ b, or acc = a @ b if first (acc may then hold garbage); fp32 inside the GEMM,
    one rounding to acc's dtype per call."""
    if first:
        _mm(a, b, out=acc)
    elif a.dtype == acc.dtype:
        acc.addmm_(_dense_on_cpu(a, acc), b)
    elif _addmm_fp32_out_works(acc.device.type):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:  # slabs of 8192 rows keep the fp32 temporary small
        for s in range(0, acc.shape[0], 8192):
            part = torch.empty_like(acc[s : s + 8192])
            _mm(a[s : s + 8192], b, out=part)
            acc[s : s + 8192] += part


def _chunk_buffers(
    n_rows: int, vocab: int, dtype: torch.dtype, logits_fp32: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (C, V), gradient (C, V) in dtype over the same bytes)."""
    logits = torch.empty(
        (n_rows, vocab), dtype=torch.float32 if logits_fp32 else dtype, device=device
    )
    if logits.dtype == dtype:
        return logits, logits
    return logits, logits.view(dtype)[:, :vocab]  # 16-bit rows in fp32 rows: stride 2V


def _run_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    scale: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    *,
    ignore_index: int,
    chunk: int,
    logits_fp32: bool,
) -> None:
    """Fill out = (losses (T,), d(hidden) or None, d(weight) or None) chunk by chunk; the chunk
    buffers are freed on return, before the caller's final cast of an fp32 d(weight)."""
    losses, grad_hidden, grad_w = out
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    logits_buf, grad_buf = _chunk_buffers(
        min(chunk, n_tokens), vocab, hidden.dtype, logits_fp32, hidden.device
    )
    for start in range(0, n_tokens, chunk):
        end = min(start + chunk, n_tokens)
        h = hidden[start:end]  # (c, H)
        logits, grad = logits_buf[: end - start], grad_buf[: end - start]
        _mm(h, weight.T, out=logits)  # (c, V) = (c, H) @ (H, V)
        _lce_rows_kernel[(end - start,)](
            logits, grad, labels[start:end], losses[start:end], scale, vocab,
            logits.stride(0), grad.stride(0), ignore_index,
            BLOCK_V=BLOCK_V, ALIASED=logits.dtype != grad.dtype, num_warps=ROW_WARPS,
        )  # fmt: skip
        if grad_hidden is not None:
            _mm(grad, weight, out=grad_hidden[start:end])  # (c, H) = (c, V) @ (V, H)
        if grad_w is not None:
            _addmm(grad_w, grad.T, h, first=start == 0)  # (V, H) += (V, c) @ (c, H)


def lce_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
    logits_fp32: bool | None = None,
    accumulate_fp32: bool | None = None,
    need_grad_hidden: bool = True,
    need_grad_weight: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """-> (loss fp32 scalar, d loss / d hidden, d loss / d weight), gradients for grad_output = 1.

    logits_fp32 / accumulate_fp32: None takes LOGITS_FP32 / ACCUMULATE_FP32 (module defaults)."""
    n_tokens, device = hidden.shape[0], hidden.device
    logits_fp32 = LOGITS_FP32 if logits_fp32 is None else logits_fp32
    accumulate_fp32 = ACCUMULATE_FP32 if accumulate_fp32 is None else accumulate_fp32
    itemsize = 4 if logits_fp32 else hidden.element_size()
    chunk = chunk_size or lce_chunk_size(n_tokens, weight.shape[0], itemsize)
    n_valid = (labels != ignore_index).sum()
    if reduction == "mean":
        scale = 1.0 / n_valid.clamp(min=1).to(torch.float32)
    else:
        scale = torch.ones((), dtype=torch.float32, device=device)
    losses = torch.empty(n_tokens, dtype=torch.float32, device=device)
    grad_hidden = torch.empty_like(hidden) if need_grad_hidden else None
    grad_w = None
    if need_grad_weight:  # zeros only when no chunk will write it
        acc_dtype = torch.float32 if accumulate_fp32 else weight.dtype
        alloc = torch.zeros if n_tokens == 0 else torch.empty
        grad_w = alloc(weight.shape, dtype=acc_dtype, device=device)
    _run_chunks(
        hidden, weight, labels, scale, (losses, grad_hidden, grad_w),
        ignore_index=ignore_index, chunk=chunk, logits_fp32=logits_fp32,
    )  # fmt: skip
    loss = losses.sum()
    if reduction == "mean":
        loss = loss / n_valid
    grad_weight = None if grad_w is None else grad_w.to(weight.dtype)  # no copy unless fp32 acc
    return loss, grad_hidden, grad_weight


class LinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, ignore_index, reduction, options):
        loss, grad_hidden, grad_weight = lce_forward(
            hidden, weight, labels, ignore_index=ignore_index, reduction=reduction,
            **options, need_grad_hidden=ctx.needs_input_grad[0],
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
    logits_fp32: bool | None = None,
    accumulate_fp32: bool | None = None,
) -> torch.Tensor:
    """Cross-entropy of hidden (T, H) @ weight (V, H).T against labels (T,), never storing (T, V).

    Returns an fp32 scalar; differentiable in hidden and weight (which may be tied to an
    embedding). chunk_size overrides lce_chunk_size (tests use it to force many chunks);
    logits_fp32 and accumulate_fp32 override LOGITS_FP32 and ACCUMULATE_FP32 (see the module
    docstring; they matter only for 16-bit inputs).
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
    options = {
        "chunk_size": chunk_size,
        "logits_fp32": logits_fp32,
        "accumulate_fp32": accumulate_fp32,
    }
    return LinearCrossEntropyFunction.apply(
        hidden, weight, labels.contiguous(), ignore_index, reduction, options
    )
