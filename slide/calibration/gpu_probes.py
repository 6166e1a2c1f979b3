"""Measure the GPU lane's rates the way the executor uses them, for `slide calibrate`.

Layer GEMMs, causal attention, HBM copies, the fused LCE, a layer's elementwise kernels, the
device AdamW and the host's dispatch floors; the link, host AdamW, cast, RAM and NVMe probes are
`slide.calibration.host_rate_probes`'. Each probe returns a figure in base units (FLOP/s, bytes/s,
elements/s) with a short note of how it was measured; `slide calibrate` turns them into a machine
profile. GPU work is timed with CUDA events after warm-up (median of repeats). Sizes are chosen so
the whole run stays under ~3 minutes on one H200 host.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from executor.adam import AdamWConfig, StepHp, update_device
from executor.buffers import OptState
from slide.calibration.probe_common import MB, Figure, WholeBuffer, cuda_median
from slide_ir.ir.graph import Attention
from slide_ir.planning.gpu_rates import REF_ATTENTION, REF_LCE, REF_TOKENS
from slide_ir.planning.shapes import layer_work, linear_shapes
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec


def matmul_rate(model: ModelSpec, tokens: int = REF_TOKENS) -> Figure:
    """A whole layer's GEMMs as the executor runs them (q, k, v in one; gate and up in one),
    forward and both backward products, BF16: at llama-3.1-8b and 8192 tokens, the reference
    shapes of the cost model's GEMM curve (`slide_ir.planning.gpu_rates`)."""
    h, i, q, kv = model.hidden_size, model.intermediate_size, model.q_dim, model.kv_dim
    flops = seconds = 0.0
    for out_f, in_f in linear_shapes(h, i, q, kv):
        x = torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(tokens, out_f, device="cuda", dtype=torch.bfloat16)
        for fn in (lambda: x @ w.t(), lambda: dy @ w, lambda: dy.t() @ x):  # noqa: B023
            seconds += cuda_median(fn)
            flops += 2.0 * tokens * out_f * in_f
    return Figure(
        flops / seconds,
        f"{model.name} layer GEMMs (fused qkv, gate_up) fwd+bwd, {tokens} tokens, bf16",
    )


def attention_seconds(a: Attention, repeats: int = 10, warmup: int = 2) -> float:
    """Causal SDPA forward + backward at `a`, BF16; `a.masked`: with the boolean mask of
    packed documents instead (two per sequence, each causal), as the executor passes it."""
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    mask = _documents_mask(a) if a.masked else None

    def step() -> None:
        torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None
        ).backward(grad)

    return cuda_median(step, repeats=repeats, warmup=warmup)


def _documents_mask(a: Attention) -> torch.Tensor:
    """(batch, 1, seq, seq) bool, True = attend: two documents per sequence, causal in each."""
    i = torch.arange(a.seq, device="cuda")
    start = torch.where(i >= a.seq // 2, a.seq // 2, 0)  # each query's document start
    mask = (i[None, :] <= i[:, None]) & (i[None, :] >= start[:, None])
    return mask.expand(a.batch, 1, a.seq, a.seq)


def attention_flops(a: Attention) -> float:
    """FLOPs as the cost model counts them: causal pairs s^2 / 2, backward = 2 x forward."""
    return 3 * 2 * 2 * a.batch * a.heads * a.seq * a.seq / 2 * a.head_dim


def attention_rate(model: ModelSpec, batch: int = 4, seq: int = 2048) -> Figure:
    """Causal SDPA forward + backward at the model's heads and head dim."""
    a = Attention(batch=batch, heads=model.num_heads, seq=seq, head_dim=model.head_dim)
    shape = (batch, model.num_heads, seq, model.head_dim)
    return Figure(attention_flops(a) / attention_seconds(a), f"SDPA causal fwd+bwd, {shape}, bf16")


def masked_attention_rate() -> Figure:
    """SDPA forward + backward with packed documents' mask at `gpu_rates.REF_ATTENTION`'s
    shape (what `Gpu.masked_attention_tflops` is measured at), FLOPs counted causal."""
    a = replace(REF_ATTENTION, masked=True)
    return Figure(attention_flops(a) / attention_seconds(a),
                  f"SDPA with a packed-documents mask fwd+bwd, {a}, bf16, FLOPs counted causal")  # fmt: skip


def hbm_rate(size_mb: int = 2048) -> Figure:
    src = torch.empty(size_mb * MB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_median(lambda: dst.copy_(src))
    return Figure(
        2 * src.numel() / seconds, f"device-to-device copy of {size_mb} MiB (read + write)"
    )


def lce_rate(model: ModelSpec, tokens: int = REF_LCE["tokens"]) -> Figure:
    """Our fused linear cross-entropy, forward + backward (GEMMs included), at the model's
    hidden size and vocabulary in the reference chunks (`gpu_rates.REF_LCE`): logits (tokens
    x vocab) per second."""
    from slide_kernels import fused_linear_cross_entropy

    def leaf(*shape: int) -> torch.Tensor:
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02
        return t.requires_grad_()

    h, w = leaf(tokens, model.hidden_size), leaf(model.vocab_size, model.hidden_size)
    labels = torch.randint(0, model.vocab_size, (tokens,), device="cuda")

    def step() -> None:  # as the executor's loss: gradients added into preset .grad buffers
        fused_linear_cross_entropy(h, w, labels, chunk_size=REF_LCE["chunk"]).backward()

    seconds = cuda_median(step, repeats=5)
    return Figure(
        tokens * model.vocab_size / seconds,
        f"{model.name} fused LCE fwd+bwd, {tokens} tokens x {model.vocab_size} vocab, bf16",
    )


def elementwise_rate(model: ModelSpec, tokens: int = 16384) -> Figure:
    """One decoder layer's memory-bound kernels (two RMSNorms, RoPE, v's copy, SwiGLU on the
    packed gate|up, two residual adds), forward + backward through autograd and the SwiGLU product
    the backward recomputes, priced the way the cost model counts them (the bytes of
    `shapes.layer_work`'s forward and backward)."""
    from executor.layers import make_rope
    from slide_kernels import rms_norm, rope, swiglu_gate_up

    m, dev, bf16 = model, "cuda", torch.bfloat16

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=bf16).requires_grad_()

    x, y = leaf(tokens, m.hidden_size), leaf(tokens, m.hidden_size)
    norm_w = torch.ones(m.hidden_size, device=dev, dtype=bf16, requires_grad=True)
    q = leaf(1, m.num_heads, tokens, m.head_dim)
    k = leaf(1, m.num_kv_heads, tokens, m.head_dim)
    qkv = leaf(tokens, m.q_dim + 2 * m.kv_dim)
    gate_up = leaf(tokens, 2 * m.intermediate_size)
    tables = make_rope(m, tokens, torch.device(dev), bf16)

    def step() -> None:
        outs = [
            rms_norm(x, norm_w, m.rms_norm_eps),
            rms_norm(y, norm_w, m.rms_norm_eps),
            *rope(q, k, tables.cos, tables.sin),
            qkv[:, m.q_dim + m.kv_dim :].contiguous(),  # v out of the projection
            swiglu_gate_up(gate_up),
            x + y,
            y + x,
        ]
        with torch.no_grad():
            swiglu_gate_up(gate_up)  # the backward's recompute of the product
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    seconds = cuda_median(step, repeats=5)
    shape = TrainConfig(batch=1, seq=tokens)
    moved = sum(layer_work(m, shape, backward=b).bytes for b in (False, True))
    return Figure(
        moved / seconds,
        f"{m.name} layer norms, RoPE, SwiGLU (packed gate|up, and the backward's recompute), "
        f"residuals fwd+bwd, {tokens} tokens, bf16",
    )


def gpu_adam_rate(elements: int = 64 * MB) -> Figure:
    """The executor's device AdamW (`executor.adam.update_device`) on one unit: BF16 grads in,
    FP32 master and moments, BF16 weights out."""

    state = OptState(
        master=torch.rand(elements, device="cuda"),
        m=torch.zeros(elements, device="cuda"),
        v=torch.zeros(elements, device="cuda"),
    )
    grad = torch.rand(elements, device="cuda").to(torch.bfloat16)
    weights = torch.empty(elements, device="cuda", dtype=torch.bfloat16)
    step_t = torch.zeros((), device="cuda")
    hp = StepHp(step=1, lr=1e-4, config=AdamWConfig(lr=1e-4, weight_decay=0.01))
    layout = WholeBuffer(elements)
    seconds = cuda_median(
        lambda: update_device(layout, weights, grad, state, hp, step_t),
        repeats=5,
    )
    return Figure(elements / seconds, f"executor device AdamW, {elements / 1e6:.0f}M elements")


def dispatch_floors(
    model: ModelSpec, tokens: int = 16, repeats: int = 20, device: str = "cuda"
) -> dict[str, Figure]:
    """The host's time to issue a decoder layer's forward (as the `fwd` op runs it: no autograd)
    and its backward (as `bwd`, from a taped forward), and the loss's forward and backward, at
    `model`'s shapes and `tokens` tokens: so little GPU work that the host's dispatch (Python,
    autograd, Triton and CUDA launches) is the whole time. Seconds each (`device` "cpu": the
    same calls, for the tests)."""
    from executor.layers import decoder_layer, decoder_layer_taped, head_loss, make_rope
    from executor.layout import layer_layout

    dev, bf16 = torch.device(device), torch.bfloat16
    sync = torch.cuda.synchronize if dev.type == "cuda" else lambda: None
    layer = layer_layout(model, 1)
    weights = torch.randn(layer.numel, device=dev, dtype=bf16) * 0.02
    norm = torch.ones(model.hidden_size, device=dev, dtype=bf16)
    lm = torch.randn(model.vocab_size, model.hidden_size, device=dev, dtype=bf16) * 0.02
    rope = make_rope(model, tokens, dev, bf16)
    x = torch.randn(1, tokens, model.hidden_size, device=dev, dtype=bf16)
    labels = torch.randint(0, model.vocab_size, (1, tokens), device=dev)
    out = torch.empty_like(x)

    def leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
        return [t.detach().requires_grad_() for t in tensors]

    def fwd(_: object) -> None:
        with torch.no_grad():
            decoder_layer(x, layer.views(weights), model, rope, out=out)

    def taped() -> tuple[torch.Tensor, list[torch.Tensor]]:
        views = layer.views(weights)
        inputs = leaves(x, *views.values())
        return decoder_layer_taped(
            inputs[0], dict(zip(views, inputs[1:], strict=True)), model, rope
        ), inputs

    def bwd(tape: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
        torch.autograd.backward(tape[0], torch.ones_like(x), inputs=tape[1])

    def loss(_: object) -> None:
        inputs = leaves(x, norm, lm)
        value = head_loss(*inputs, labels, eps=model.rms_norm_eps, scale=1.0, chunk=None)
        value.backward(inputs=inputs)

    def host_median(run: Callable[[object], object], prepare: Callable[[], object]) -> float:
        times = []
        for _ in range(repeats + 2):  # the first two warm up
            arg = prepare()
            sync()
            t0 = time.perf_counter()
            run(arg)
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[2:])

    how = f"{model.name} at 1 x {tokens} tokens, host clock around the op and a synchronize"
    return {
        "fwd": Figure(host_median(fwd, lambda: None), f"{how}: a decoder layer's no-grad forward"),
        "bwd": Figure(host_median(bwd, taped), f"{how}: a decoder layer's backward"),
        "loss": Figure(host_median(loss, lambda: None), f"{how}: final norm + fused LCE fwd+bwd"),
    }
