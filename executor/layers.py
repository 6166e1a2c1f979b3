"""Functional layers of Llama / Qwen2 / Qwen3 / Mistral, on parameters that are views into a
unit's flat buffer (see `layout`), so one cache-unit slot can run any decoder layer.

Numerics follow transformers' modules (LlamaDecoderLayer and kin, SDPA attention): the same
operations in the same order, with our kernels (via `fused`) in place of RMSNorm, RoPE, SwiGLU
and the LM head + cross-entropy. Shapes: B batch, S sequence, H hidden, I intermediate,
nh / nkv query / key-value heads of hd dims.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from executor import fused
from slide_ir.specs.model import ModelSpec
from slide_kernels import rope_cos_sin

Params = Mapping[str, torch.Tensor]


@dataclass(frozen=True, kw_only=True, slots=True)
class Rope:
    """cos/sin tables and the attention mask: (S, hd) and (S, S) for positions 0..S-1, the
    run's one set; (B, S, hd) and (B, 1, S, S) for a micro-batch of packed documents."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None  # bool, True = attend; None = plain causal


def rope_scaling(hf_config: Mapping[str, Any]) -> dict[str, Any] | None:
    """transformers 5 writes `rope_parameters`; 4.x configs `rope_scaling` (or nothing)."""
    params = hf_config.get("rope_parameters") or hf_config.get("rope_scaling")
    return dict(params) if params else None


def make_rope(spec: ModelSpec, seq: int, device: torch.device, dtype: torch.dtype) -> Rope:
    """Built once per run: every layer and every step uses the same positions."""
    positions = torch.arange(seq, device=device)
    scaling = rope_scaling(spec.to_hf_config())
    cos, sin = rope_cos_sin(spec.head_dim, positions, spec.rope_theta, scaling, dtype=dtype)
    mask = None
    window = spec.sliding_window
    if window is not None and window < seq:  # mistral: key j visible from i iff i-w < j <= i
        i = positions[:, None]
        j = positions[None, :]
        mask = (j <= i) & (j > i - window)
    return Rope(cos=cos, sin=sin, mask=mask)


def document_rope(spec: ModelSpec, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
    """A micro-batch of packed documents: positions (B, S) restart at 0 at each document's
    first token, so token i's document begins at i - positions[i] and i attends to j iff
    i - positions[i] <= j <= i (and, with a sliding window w, i - w < j), exactly what each
    document would see alone. Built by the embedding's forward, once per micro-batch."""
    scaling = rope_scaling(spec.to_hf_config())
    cos, sin = rope_cos_sin(spec.head_dim, positions, spec.rope_theta, scaling, dtype=dtype)
    seq = positions.shape[1]
    i = torch.arange(seq, device=positions.device)[:, None]  # (S, 1) queries
    j = i.view(1, seq)  # (1, S) keys
    mask = (j <= i) & (j >= (i.view(1, seq) - positions)[..., None])  # (B, S, S)
    window = spec.sliding_window
    if window is not None and window < seq:
        mask &= j > i - window
    return Rope(cos=cos, sin=sin, mask=mask[:, None])  # cos/sin (B, S, hd), mask (B, 1, S, S)


def _linear(x: torch.Tensor, p: Params, name: str) -> torch.Tensor:
    return F.linear(x, p[f"{name}.w"], p.get(f"{name}.b"))


def attention(x: torch.Tensor, p: Params, spec: ModelSpec, rope: Rope) -> torch.Tensor:
    """Self-attention of the normed input x (B, S, H) -> (B, S, H), before the residual add."""
    b, s, _ = x.shape
    hd, nh, nkv = spec.head_dim, spec.num_heads, spec.num_kv_heads
    sizes = (nh * hd, nkv * hd, nkv * hd)
    qkv = fused.grouped_linear(x, p["qkv.w"], p.get("qkv.b"), sizes)  # (B, S, (nh + 2 nkv) hd)
    q, k, v = qkv.split(sizes, dim=-1)
    q, k, v = q.view(b, s, nh, hd), k.view(b, s, nkv, hd), v.view(b, s, nkv, hd)
    if spec.qk_norm:  # qwen3: RMSNorm over each head's hd dims, before RoPE
        q = fused.rms_norm(q, p["q_norm"], spec.rms_norm_eps)
        k = fused.rms_norm(k, p["k_norm"], spec.rms_norm_eps)
    # (B, heads, S, hd); v copied out of the projection's output, which SDPA would otherwise
    # keep alive whole for the backward through its view (q and k leave it through RoPE)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2).contiguous()
    q, k = fused.rope(q, k, rope.cos, rope.sin)
    gqa = nkv != nh
    if gqa and rope.mask is not None and q.is_cuda:
        # SDPA's fused CUDA kernels take grouped heads only without a mask (with one it falls
        # back to the math kernel, an (S, S) matrix per head): repeat them, as transformers does
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        gqa = False
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=rope.mask,
        is_causal=rope.mask is None,
        scale=hd**-0.5,
        enable_gqa=gqa,
    )  # (B, nh, S, hd)
    out = out.transpose(1, 2).reshape(b, s, nh * hd)
    return _linear(out, p, "o")  # (B, S, H)


def _residual_and_gate_up(
    x: torch.Tensor, p: Params, spec: ModelSpec, rope: Rope
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer up to its SwiGLU: the residual stream after attention h (B, S, H) and
    the fused gate|up projection (B, S, 2I); the layer's output is h + down(swiglu(gate_up))."""
    eps = spec.rms_norm_eps
    h = x + attention(fused.rms_norm(x, p["ln1"], eps), p, spec, rope)
    i = spec.intermediate_size
    normed = fused.rms_norm(h, p["ln2"], eps)
    return h, fused.grouped_linear(normed, p["gate_up.w"], p.get("gate_up.b"), (i, i))


def _mlp_tail(
    h: torch.Tensor, gate_up: torch.Tensor, p: Params, out: torch.Tensor | None
) -> torch.Tensor:
    """h + down(swiglu(gate_up)): the layer's output, into `out` when given."""
    return torch.add(h, _linear(fused.swiglu_gate_up(gate_up), p, "down"), out=out)


def decoder_layer(
    x: torch.Tensor, p: Params, spec: ModelSpec, rope: Rope, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """One decoder layer, x (B, S, H) -> (B, S, H). `out` (no-grad forward only) receives the
    result in place, so the forward writes straight into its activation slot."""
    h, gate_up = _residual_and_gate_up(x, p, spec, rope)
    return _mlp_tail(h, gate_up, p, out)


def decoder_layer_taped(
    x: torch.Tensor, p: Params, spec: ModelSpec, rope: Rope, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """A decoder layer's forward recorded for its backward (grad mode on; x and p leaves).
    It returns the root of the backward, `torch.autograd.backward(root, d_out)`: a tensor of
    the output's shape that holds no data. The backward needs the gate|up projection and the
    down weight, never the SwiGLU product nor the layer's output, so the tape keeps neither
    and a recompute (`out` None) skips the SwiGLU, the down GEMM and the last residual add, a
    quarter of a Llama layer's forward FLOPs; a kept forward (`out`, the activation slot)
    computes the output there without recording it."""
    h, gate_up = _residual_and_gate_up(x, p, spec, rope)
    root: torch.Tensor = _MlpTail.apply(h, gate_up, p["down.w"], p.get("down.b"))
    if out is not None:
        with torch.no_grad():
            _mlp_tail(h, gate_up, p, out)
    return root


class _MlpTail(torch.autograd.Function):
    """The backward of h + F.linear(swiglu(gate_up), w, b) without its forward. The product is
    recomputed from gate_up (one elementwise pass); d_out flows to h as the residual passes
    it, and to the product, w and b through the products autograd's own linear backward runs
    (`mm` over the flattened tokens, the operands in its order and layout), then through the
    SwiGLU's own backward: the gradients are bit for bit those of the recorded expression."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h: torch.Tensor, gate_up: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(gate_up, w)
        ctx.has_bias = b is not None
        return h.new_empty(()).expand(h.shape)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, d_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        gate_up, w = ctx.saved_tensors
        d2 = d_out.reshape(-1, d_out.shape[-1])  # (T, H)
        prod = fused.swiglu_gate_up(gate_up)  # (B, S, I)
        d_w = d2.t().mm(prod.view(-1, prod.shape[-1]))  # (H, T) @ (T, I)
        del prod
        d_prod = d2.mm(w).view(*gate_up.shape[:-1], w.shape[1])  # (T, H) @ (H, I)
        d_gate_up = fused.swiglu_gate_up_backward(gate_up, d_prod)
        return d_out, d_gate_up, d_w, d2.sum(0) if ctx.has_bias else None


def embed(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    """out (B, S, H) = weight[ids]: a gather straight into the activation slot."""
    torch.index_select(weight, 0, ids.reshape(-1), out=out.view(-1, weight.shape[1]))


def embed_backward(
    ids: torch.Tensor, grad_out: torch.Tensor, grad_weight: torch.Tensor, *, accumulate: bool
) -> None:
    """grad_weight (V, H) (+)= scatter-add of grad_out (B, S, H) rows at ids, the same sums in
    the same order on every run. index_put_ with accumulate sorts the indices on CUDA
    (deterministic fp32 sums of repeated tokens); on the CPU its threads add into shared rows in
    whatever order they get there, so two runs' embedding gradients differed in the last bit.
    index_add_ along dim 0 adds the rows in token order there, at any thread count."""
    if not accumulate:
        grad_weight.zero_()
    h = grad_weight.shape[1]
    rows, grads = ids.reshape(-1), grad_out.reshape(-1, h)
    if grad_weight.is_cuda:
        grad_weight.index_put_((rows,), grads, accumulate=True)
    else:
        grad_weight.index_add_(0, rows, grads)


def head_loss(
    x: torch.Tensor,
    norm: torch.Tensor,
    lm: torch.Tensor,
    labels: torch.Tensor,
    *,
    eps: float,
    scale: float,
    chunk: int | None,
) -> torch.Tensor:
    """Final RMSNorm + LM head + cross-entropy: scale x (sum of token losses), an fp32 scalar.
    x (B, S, H), labels (B, S) already shifted (label t is the token after input t)."""
    h = fused.rms_norm(x, norm, eps).reshape(-1, x.shape[-1])  # (B S, H)
    return fused.linear_cross_entropy(h, lm, labels.reshape(-1), chunk=chunk) * scale
