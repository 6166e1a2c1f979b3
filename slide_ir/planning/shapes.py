"""The GPU work of a decoder layer and of the fused loss, with the shapes the executor runs.

A GEMM's or an attention kernel's rate depends on its shape, so the ops carry the shapes
(`Work.gemms`, `Work.attention`) and the cost model prices each by its own (`gpu_rates`). The
shapes are those of the executor's layers (`executor/layers.py`), T = batch x seq tokens:

    forward, per layer    qkv   (T, q + 2 kv, H)    q, k, v in one GEMM (`qkv.w`)
                          o     (T, H, q)
                          gate_up (T, 2 I, H)       gate and up in one GEMM (`gate_up.w`)
                          down  (T, H, I)
    backward, each (M, N, K) above gives d(input) (M, K, N) and d(weight) (N, K, M)

    fused loss (`slide_kernels.lce`), per chunk of C tokens (the last one shorter):
                          logits (C, V, H), d(hidden) (C, H, V), d(weight) (V, H, C)

A mixture-of-experts layer's routed GEMMs depend on the routing; its work carries no shapes and
is priced at the flat matmul rate.
"""

from __future__ import annotations

from dataclasses import replace

from slide_ir.ir.graph import Attention, Gemm, Work
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec


def linear_shapes(h: int, i: int, q: int, kv: int) -> tuple[tuple[int, int], ...]:
    """(out, in) of a dense decoder layer's four GEMMs: qkv, o, gate_up, down."""
    return ((q + 2 * kv, h), (h, q), (2 * i, h), (h, i))


def forward_gemms(h: int, i: int, q: int, kv: int, tokens: int) -> tuple[Gemm, ...]:
    """(M, N, K) of a dense decoder layer's forward matmuls over `tokens` rows."""
    return tuple(Gemm(m=tokens, n=out, k=inp) for out, inp in linear_shapes(h, i, q, kv))


def layer_forward_gemms(model: ModelSpec, tokens: int) -> tuple[Gemm, ...]:
    """`forward_gemms` of `model`'s layer; () for MoE."""
    if model.is_moe:
        return ()
    return forward_gemms(
        model.hidden_size, model.intermediate_size, model.q_dim, model.kv_dim, tokens
    )


def backward_gemms(forward: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
    """Each forward GEMM's two backward products: d(input) and d(weight)."""
    grads = []
    for g in forward:
        grads.append(Gemm(m=g.m, n=g.k, k=g.n, count=g.count))  # dY (M, N) @ W (N, K)
        grads.append(Gemm(m=g.n, n=g.k, k=g.m, count=g.count))  # dY^T (N, M) @ X (M, K)
    return tuple(grads)


def layer_attention(model: ModelSpec, batch: int, seq: int, *, masked: bool = False) -> Attention:
    window = model.sliding_window if model.sliding_window and model.sliding_window < seq else 0
    return Attention(batch=batch, heads=model.num_heads, seq=seq, head_dim=model.head_dim,
                     window=window, masked=masked)  # fmt: skip


def layer_work(model: ModelSpec, config: TrainConfig, *, backward: bool) -> Work:
    """One decoder layer's forward or backward: matmul and attention FLOPs with their shapes,
    and the elementwise kernels' HBM traffic (the backward's about twice, plus the SwiGLU
    product it recomputes from the tape's gate|up: `executor.layers.decoder_layer_taped`)."""
    bs = (config.batch, config.seq)
    scale = 2 if backward else 1
    gemms = layer_forward_gemms(model, config.batch * config.seq)
    recomputed = _swiglu_bytes(model, config) if backward and not model.is_moe else 0
    return Work(
        flops=scale * model.layer_fwd_flops(*bs),
        attn_flops=scale * model.attention_fwd_flops(*bs),
        bytes=scale * model.layer_elementwise_bytes(*bs) + recomputed,
        gemms=backward_gemms(gemms) if backward else gemms,
        attention=layer_attention(model, *bs, masked=config.document_mask),
    )


def recompute_work(model: ModelSpec, config: TrainConfig) -> Work:
    """A recomputed decoder layer (`executor.layers.decoder_layer_taped`): its forward without
    the SwiGLU, the down projection and the residual add after it, none of whose outputs the
    tape keeps. An MoE layer's work carries no shapes: its recompute is its whole forward."""
    forward = layer_work(model, config, backward=False)
    if model.is_moe:
        return forward
    down = forward.gemms[-1]  # (T, H, I), `linear_shapes`' last
    residual_add = config.batch * config.seq * 6 * model.hidden_size  # read 2, write 1, bf16
    skipped = _swiglu_bytes(model, config) + residual_add
    return replace(forward, flops=forward.flops - down.flops, gemms=forward.gemms[:-1],
                   bytes=forward.bytes - skipped)  # fmt: skip


def _swiglu_bytes(model: ModelSpec, config: TrainConfig) -> int:
    """The SwiGLU's pass: gate and up read, the product written, bf16."""
    return config.batch * config.seq * 6 * model.intermediate_size


def loss_gemms(*, hidden: int, vocab: int, tokens: int, chunk: int) -> tuple[Gemm, ...]:
    """The fused loss's GEMMs, forward and backward, over `tokens` in chunks of `chunk`."""
    full, rest = divmod(tokens, chunk)
    sizes = [(chunk, full)] if full else []
    sizes += [(rest, 1)] if rest else []
    h, v = hidden, vocab
    gemms = []
    for c, count in sizes:
        gemms += [Gemm(m=c, n=v, k=h, count=count), Gemm(m=c, n=h, k=v, count=count),
                  Gemm(m=v, n=h, k=c, count=count)]  # fmt: skip
    return tuple(gemms)


def loss_work(model: ModelSpec, config: TrainConfig, chunk: int) -> Work:
    """The fused linear cross-entropy, forward and backward: LM-head FLOPs with the chunks'
    GEMM shapes, the logits' elementwise traffic, and the logits count."""
    bs = (config.batch, config.seq)
    return Work(
        flops=model.head_fwd_flops(*bs) + model.head_bwd_flops(*bs),
        bytes=model.head_elementwise_bytes(*bs),
        elements=config.batch * config.seq * model.vocab_size,
        gemms=loss_gemms(
            hidden=model.hidden_size,
            vocab=model.vocab_size,
            tokens=config.batch * config.seq,
            chunk=chunk,
        ),
    )


def eval_loss_work(model: ModelSpec, config: TrainConfig, chunk: int) -> Work:
    """The fused loss's forward alone (an eval batch): each chunk's logits GEMM (the first of
    `loss_gemms`' three per chunk size) and one read of its logits (the log-sum-exp), a third
    of the training loss's traffic; no gradient GEMMs."""
    bs = (config.batch, config.seq)
    tokens = config.batch * config.seq
    forward = loss_gemms(hidden=model.hidden_size, vocab=model.vocab_size, tokens=tokens,
                         chunk=chunk)[::3]  # fmt: skip
    return Work(
        flops=model.head_fwd_flops(*bs),
        bytes=model.head_elementwise_bytes(*bs) // 3,
        elements=tokens * model.vocab_size,
        gemms=forward,
    )
