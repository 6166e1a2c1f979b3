"""Fused linear cross-entropy against the float64 reference (CPU, interpreter) and on the GPU."""

import pytest
import torch
from kernel_checks import (
    BF16_FACTOR,
    BF16_INTERPRET_FACTOR,
    DEVICE,
    assert_bf16_rule,
    assert_close_fp32,
    leaf,
)

from slide_kernels import fused_linear_cross_entropy, reference
from slide_kernels.lce import lce_chunk_size, lce_forward

IGNORE = -100


def _labels(n_tokens: int, vocab: int, ignored: slice | None, gen: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, vocab, (n_tokens,), generator=gen)
    labels[torch.rand(n_tokens, generator=gen) < 0.2] = IGNORE  # scattered ignored tokens
    if ignored is not None:
        labels[ignored] = IGNORE  # a run of them: whole chunks with nothing to learn
    return labels


def _check_against_fp64(hidden, weight, labels, *, reduction="mean", chunk_size=None):
    """Kernel in fp32 vs the reference in fp64: loss, d(hidden), d(weight), random upstream grad."""
    h64, w64 = leaf(hidden, torch.float64), leaf(weight, torch.float64)
    h32, w32 = leaf(hidden, torch.float32), leaf(weight, torch.float32)
    upstream = torch.rand((), device=DEVICE) + 0.5
    labels = labels.to(DEVICE)
    loss = fused_linear_cross_entropy(
        h32, w32, labels, ignore_index=IGNORE, reduction=reduction, chunk_size=chunk_size
    )
    gold = reference.linear_cross_entropy(
        h64, w64, labels, ignore_index=IGNORE, reduction=reduction
    )
    loss.backward(upstream)
    gold.backward(upstream.double())
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert_close_fp32(loss.detach(), gold.detach(), "lce")
    assert_close_fp32(h32.grad, h64.grad, "lce")
    assert_close_fp32(w32.grad, w64.grad, "lce")


@pytest.mark.parametrize(
    ("n_tokens", "hidden", "vocab", "chunk", "ignored"),
    [
        (41, 24, 37, 8, slice(8, 16)),  # 6 chunks, the second all ignored, a ragged last one
        (7, 5, 129, 3, None),  # vocab just past a power of two, tiny hidden
        (33, 16, 300, None, slice(0, 5)),  # default chunk size: one chunk
        (50, 12, 4100, 16, slice(32, 48)),  # vocab > BLOCK_V: two row steps, a ragged one
    ],
)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_lce_matches_fp64_reference(n_tokens, hidden, vocab, chunk, ignored, reduction):
    gen = torch.Generator().manual_seed(n_tokens * vocab)
    h = torch.randn(n_tokens, hidden, generator=gen)
    w = torch.randn(vocab, hidden, generator=gen) / hidden**0.5
    labels = _labels(n_tokens, vocab, ignored, gen)
    _check_against_fp64(h, w, labels, reduction=reduction, chunk_size=chunk)


def test_lce_all_ignored_is_nan_loss_and_zero_grads_like_torch():
    h = torch.randn(9, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(11, 8, device=DEVICE, requires_grad=True)
    labels = torch.full((9,), IGNORE, device=DEVICE)
    loss = fused_linear_cross_entropy(h, w, labels, chunk_size=4)
    loss.backward()
    assert torch.isnan(loss)
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0


def test_lce_tied_weights_gradient_sums_both_uses():
    """LM head tied to the embedding: d(weight) = embedding's scatter + LM head's, as in torch."""
    gen = torch.Generator().manual_seed(1)
    vocab, hidden, n_tokens = 53, 16, 29
    table = torch.randn(vocab, hidden, generator=gen)
    ids = torch.randint(0, vocab, (n_tokens,), generator=gen).to(DEVICE)
    labels = _labels(n_tokens, vocab, slice(0, 10), gen).to(DEVICE)
    grads = []
    for dtype, loss_fn in [
        (torch.float32, lambda h, w: fused_linear_cross_entropy(h, w, labels, chunk_size=10)),
        (torch.float64, lambda h, w: reference.linear_cross_entropy(h, w, labels)),
    ]:
        embedding = torch.nn.Embedding(vocab, hidden, dtype=dtype, device=DEVICE)
        with torch.no_grad():
            embedding.weight.copy_(table)
        h = torch.tanh(embedding(ids))  # (T, H): some work between the two uses
        loss_fn(h, embedding.weight).backward()
        grads.append(embedding.weight.grad)
    assert_close_fp32(grads[0], grads[1], "lce")


def test_lce_without_grad_gives_the_loss_only():
    h, w = torch.randn(10, 6, device=DEVICE), torch.randn(13, 6, device=DEVICE)
    labels = torch.randint(0, 13, (10,), device=DEVICE)
    loss = fused_linear_cross_entropy(h, w, labels, chunk_size=4)
    assert loss.grad_fn is None
    assert_close_fp32(loss, reference.linear_cross_entropy(h.double(), w.double(), labels), "lce")


def test_lce_backward_twice_is_refused():
    h = torch.randn(4, 3, device=DEVICE, requires_grad=True)
    w, y = torch.randn(5, 3, device=DEVICE), torch.randint(0, 5, (4,), device=DEVICE)
    loss = fused_linear_cross_entropy(h, w, y)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()


def test_lce_rejects_bad_arguments():
    h, w, y = torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="reduction"):
        fused_linear_cross_entropy(h, w, y, reduction="none")
    with pytest.raises(ValueError, match="weight"):
        fused_linear_cross_entropy(h, torch.randn(5, 4), y)


def test_lce_float64_on_cpu_falls_back_to_the_reference():
    h, w = torch.randn(6, 4, dtype=torch.float64), torch.randn(7, 4, dtype=torch.float64)
    y = torch.randint(0, 7, (6,))
    assert torch.equal(fused_linear_cross_entropy(h, w, y), reference.linear_cross_entropy(h, w, y))


def test_chunk_size_follows_the_memory_budget():
    # bf16 logits: T / 8 tokens (1/48 of eager's T x V x 12 bytes), at most 2 GiB of logits
    assert lce_chunk_size(8192, 128256) == 1024
    assert lce_chunk_size(65536, 128256) == 8192  # 8192 x 128256 x 2 B = 1.96 GiB <= 2 GiB
    assert lce_chunk_size(131072, 128256) == 8320  # the 2 GiB cap, a multiple of 128
    assert lce_chunk_size(8192, 128256, 4) == 512  # fp32 logits: half the tokens
    assert lce_chunk_size(65536, 128256, budget_bytes=1 << 28) == 1024
    assert lce_chunk_size(8192, 128256, eager_divisor=96) == 512
    assert lce_chunk_size(100, 128256) == 100  # never more than the tokens
    assert lce_chunk_size(1000, 128256) == 128  # at least one GEMM tile
    assert lce_chunk_size(10**6, 32000) == 33536  # 33536 x 32000 x 2 B <= 2 GiB, a multiple of 128


def test_default_chunk_meets_the_memory_target_at_8192_tokens():
    """The target: peak extra <= 12% of eager's (T x V x 12 B) at T = 8192, Llama 3 head."""
    n_tokens, hidden, vocab = 8192, 4096, 128256
    chunk = lce_chunk_size(n_tokens, vocab)
    # returned bf16 d(weight) and d(hidden), one chunk of bf16 logits, fp32 per-token losses
    peak = vocab * hidden * 2 + n_tokens * hidden * 2 + chunk * vocab * 2 + n_tokens * 4
    assert peak <= 0.115 * n_tokens * vocab * 12  # 0.5 points left for the allocator's rounding


@pytest.mark.parametrize(("logits_fp32", "accumulate_fp32"), [(False, False), (True, True)])
def test_lce_bf16_in_the_interpreter(logits_fp32, accumulate_fp32):
    """bf16 inputs through the launcher (on the CPU the public function sends them to the
    reference): the loss from bf16 logits vs torch's bf16 loss, gradients within
    BF16_INTERPRET_FACTOR of torch's bf16 error, both against the float32 result."""
    gen = torch.Generator().manual_seed(5)
    n_tokens, hidden, vocab = 256, 64, 1000
    h = torch.randn(n_tokens, hidden, generator=gen).to(DEVICE)
    w = (torch.randn(vocab, hidden, generator=gen) / hidden**0.5).to(DEVICE)
    labels = _labels(n_tokens, vocab, slice(0, 32), gen).to(DEVICE)
    # compiled on the GPU: round-to-nearest stores, STYLE's plain 2x rule
    factor = BF16_FACTOR if DEVICE == "cuda" else BF16_INTERPRET_FACTOR
    results = {}
    for name, dtype in [("gold", torch.float32), ("torch", torch.bfloat16)]:
        hh = h.to(dtype, copy=True).requires_grad_()
        ww = w.to(dtype, copy=True).requires_grad_()
        loss = reference.linear_cross_entropy(hh, ww, labels, ignore_index=IGNORE)
        loss.backward()
        results[name] = (loss.detach(), hh.grad, ww.grad)
    results["kernel"] = lce_forward(
        h.bfloat16(), w.bfloat16(), labels, ignore_index=IGNORE, chunk_size=32,
        logits_fp32=logits_fp32, accumulate_fp32=accumulate_fp32,
    )  # fmt: skip
    assert results["kernel"][2].dtype == torch.bfloat16
    assert_bf16_rule(results["kernel"][0], results["torch"][0], results["gold"][0], "loss")
    for i, what in [(1, "d(hidden)"), (2, "d(weight)")]:
        assert_bf16_rule(
            results["kernel"][i], results["torch"][i], results["gold"][i], what,
            factor=factor,
        )  # fmt: skip


# --- GPU: bf16 at realistic shapes, fast path, memory ---------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n_tokens", "hidden", "vocab"),
    [(4096, 4096, 128256), (3000, 2048, 32003)],  # 8 chunks; 12 chunks with an odd vocab
)
@pytest.mark.parametrize(("logits_fp32", "accumulate_fp32"), [(False, False), (True, True)])
def test_lce_bf16_gpu_within_twice_torch_error(
    n_tokens, hidden, vocab, logits_fp32, accumulate_fp32
):
    """Default (bf16 logits, d(weight) summed in bf16, ~sqrt(chunks / 2) roundings: 2 and 2.4
    here, against eager's one) and the all-fp32 variant, both under STYLE's 2x rule."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(n_tokens, hidden, device="cuda", generator=gen)
    w = torch.randn(vocab, hidden, device="cuda", generator=gen) / hidden**0.5
    labels = torch.randint(0, vocab, (n_tokens,), device="cuda", generator=gen)
    labels[: n_tokens // 4] = IGNORE

    def kernel(hh, ww, y):
        return fused_linear_cross_entropy(
            hh, ww, y, logits_fp32=logits_fp32, accumulate_fp32=accumulate_fp32
        )

    results = {}
    for name, dtype, fn in [
        ("gold", torch.float32, reference.linear_cross_entropy),
        ("torch", torch.bfloat16, reference.linear_cross_entropy),
        ("kernel", torch.bfloat16, kernel),
    ]:
        hh, ww = leaf(h, dtype), leaf(w, dtype)
        loss = fn(hh, ww, labels)
        loss.backward()
        results[name] = (loss.detach(), hh.grad, ww.grad)
        del hh, ww, loss
    for i, what in enumerate(["loss", "d(hidden)", "d(weight)"]):
        assert_bf16_rule(results["kernel"][i], results["torch"][i], results["gold"][i], what)


@pytest.mark.gpu
def test_lce_uses_the_fp32_addmm_fast_path():
    from slide_kernels.lce import _addmm_fp32_out_works

    assert _addmm_fp32_out_works("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("n_tokens", [8192, 32768])
def test_lce_peak_memory_stays_within_budget(n_tokens):
    """Peak extra = bf16 d(weight) + one chunk of bf16 logits + d(hidden) + losses, and <= 12% of
    eager's from T = 8192 on (the target)."""
    hidden, vocab = 4096, 128256
    h = torch.randn(n_tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (n_tokens,), device="cuda")
    fused_linear_cross_entropy(h, w, labels).backward()  # warm-up: cuBLAS workspaces, autotune
    h.grad = w.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fused_linear_cross_entropy(h, w, labels).backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    chunk = lce_chunk_size(n_tokens, vocab)
    budget = (vocab * hidden + chunk * vocab + n_tokens * hidden) * 2 + n_tokens * 4 + (64 << 20)
    # eager's floor: in backward the fp32 log-softmax and two fp32 (T, V) gradients live at once
    eager = n_tokens * vocab * (4 + 4 + 4)
    assert peak <= budget, f"peak {peak / 2**30:.2f} GiB > budget {budget / 2**30:.2f} GiB"
    assert peak <= 0.12 * eager
