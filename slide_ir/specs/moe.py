"""Mixture-of-experts and multi-head latent attention shapes: per-layer parameters and FLOPs.

A `ModelSpec` with `num_experts > 0` (qwen3_moe, glm4_moe, deepseek_v3, glm_moe_dsa) has decoder
layers that
differ: the first `dense_layers` keep a dense SwiGLU MLP (`intermediate_size`), the rest are MoE
layers (a router, `num_experts` routed experts of width `moe_intermediate_size`, `shared_experts`
always-active ones). DeepSeek's multi-head latent attention (MLA, `kv_lora_rank > 0`) replaces
q/k/v projections by low-rank ones. GLM-5 (glm_moe_dsa) adds DeepSeek Sparse Attention: a small
indexer (`index_n_heads` x `index_head_dim`, read from the spec's HF config) scores every causal
key, and each query attends to its `index_topk` best keys only.

Invariants:
- Counts follow transformers' modules exactly (`sum(p.numel() for p in model.parameters())`;
  the router's `e_score_correction_bias` is a buffer there, not a parameter, and is not counted;
  nor are DeepSeek/GLM multi-token-prediction layers, which transformers does not build).
- Memory follows total parameters; FLOPs follow the parameters one token multiplies
  (`active_matmul_params`): attention, router, `experts_per_token` routed + the shared experts.
- Layers are numbered 1..num_layers as in op ids (0 is the embedding).

Pure functions of the spec; `slide_ir.specs.model` imports this module, so it imports nothing of it
at run time.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slide_ir.specs.model import ModelSpec

_MOE_ONLY = ("experts_per_token", "shared_experts", "moe_intermediate_size", "dense_layers")


def check(spec: ModelSpec) -> None:
    """Cross-field rules of MoE and MLA shapes; ValueError names the field and its range."""
    if spec.num_experts == 0:
        for name in _MOE_ONLY:
            if getattr(spec, name):
                raise ValueError(f"{name} must be 0 on a dense model (num_experts = 0)")
    else:
        if not 1 <= spec.experts_per_token <= spec.num_experts:
            raise ValueError(
                f"experts_per_token must be in [1, num_experts={spec.num_experts}]; "
                f"got {spec.experts_per_token}"
            )
        if spec.moe_intermediate_size < 1:
            raise ValueError("moe_intermediate_size must be >= 1 on an MoE model")
        if spec.dense_layers >= spec.num_layers:
            raise ValueError(
                f"dense_layers must be in [0, num_layers={spec.num_layers}); got {spec.dense_layers}"
            )
    if spec.kv_lora_rank and not 0 < spec.qk_rope_head_dim < spec.head_dim:
        raise ValueError(
            f"qk_rope_head_dim must be in [1, head_dim={spec.head_dim}) with MLA; "
            f"got {spec.qk_rope_head_dim}"
        )
    if spec.kv_lora_rank and spec.v_head_dim < 1:
        raise ValueError("v_head_dim must be >= 1 with MLA (kv_lora_rank > 0)")


def is_moe_layer(spec: ModelSpec, layer: int) -> bool:
    """Decoder layer `layer` (1-based) has routed experts."""
    return spec.num_experts > 0 and layer > spec.dense_layers


def v_dim(spec: ModelSpec) -> int:
    """Value width of all heads (MLA: heads x v_head_dim; GQA: kv heads x head_dim)."""
    if spec.kv_lora_rank:
        return spec.num_heads * spec.v_head_dim
    return spec.kv_dim


def dsa_indexer(spec: ModelSpec) -> tuple[int, int, int]:
    """(top-k keys, indexer heads, indexer head dim) of DeepSeek Sparse Attention; zeros when the
    model has none (only glm_moe_dsa here)."""
    if spec.model_type != "glm_moe_dsa":
        return (0, 0, 0)
    return _dsa_fields(spec.hf_config_json)


@functools.lru_cache(maxsize=32)
def _dsa_fields(config_json: str) -> tuple[int, int, int]:
    config = json.loads(config_json) if config_json else {}
    topk, heads, dim = (
        int(config.get(k) or 0) for k in ("index_topk", "index_n_heads", "index_head_dim")
    )
    return topk, heads, dim


def attention_fwd_flops(spec: ModelSpec, batch: int, seq: int) -> float:
    """Attention FLOPs of one layer's forward. Dense: `ModelSpec.attention_fwd_flops` (causal
    s^2/2 pairs). DSA: each query attends to min(its causal keys, top-k) keys, s k - k^2/2 pairs
    for s > k, at head_dim + v_head_dim per pair, plus the indexer's q.k scores over every causal
    pair (index heads x index head dim; its ReLU and weighting are elementwise, ignored)."""
    topk, heads, dim = dsa_indexer(spec)
    if not topk:
        return spec.attention_fwd_flops(batch, seq)
    pairs = seq * seq / 2 if topk >= seq else seq * topk - topk * topk / 2
    v = spec.v_head_dim or spec.head_dim
    sparse = 2 * batch * spec.num_heads * pairs * (spec.head_dim + v)
    return sparse + 2 * batch * heads * dim * seq * seq / 2


def attention_matmul_params(spec: ModelSpec) -> int:
    """Weights of the attention projections (2 FLOPs per weight per token)."""
    h, heads = spec.hidden_size, spec.num_heads
    if not spec.kv_lora_rank:
        return h * (spec.q_dim + 2 * spec.kv_dim) + spec.q_dim * h
    q_out = heads * spec.head_dim
    q = h * spec.q_lora_rank + spec.q_lora_rank * q_out if spec.q_lora_rank else h * q_out
    nope = spec.head_dim - spec.qk_rope_head_dim
    kv = h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
    kv += spec.kv_lora_rank * heads * (nope + spec.v_head_dim)
    _, idx_heads, idx_dim = dsa_indexer(spec)  # wq_b (from the q latent), wk, weights_proj
    indexer = idx_heads * idx_dim * spec.q_lora_rank + idx_dim * h + idx_heads * h
    return q + kv + heads * spec.v_head_dim * h + indexer


def attention_other_params(spec: ModelSpec) -> int:
    """Attention biases and norms: q/k/v (and o) biases, per-head q/k norms, MLA's two norms."""
    if spec.kv_lora_rank:  # q_a/kv_a layernorms; q_a, kv_a and o biases when attention_bias
        norms = spec.q_lora_rank + spec.kv_lora_rank
        bias = spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_head_dim + spec.hidden_size
        return norms + bias * spec.attention_bias + 2 * dsa_indexer(spec)[2]  # indexer k LayerNorm
    bias = (spec.q_dim + 2 * spec.kv_dim) * spec.attention_bias
    return bias + spec.hidden_size * spec.o_proj_bias + 2 * spec.head_dim * spec.qk_norm


def expert_params(spec: ModelSpec) -> int:
    """One expert's SwiGLU weights (gate, up, down)."""
    return 3 * spec.hidden_size * spec.moe_intermediate_size


def routed_expert_params(spec: ModelSpec, layer: int) -> int:
    """Weights of the routed experts of one layer: the part expert parallelism splits."""
    return spec.num_experts * expert_params(spec) if is_moe_layer(spec, layer) else 0


def mlp_params(spec: ModelSpec, layer: int) -> int:
    """Every MLP weight of one layer: dense MLP, or router + routed + shared experts."""
    if not is_moe_layer(spec, layer):
        return 3 * spec.hidden_size * spec.intermediate_size
    router = spec.num_experts * spec.hidden_size
    return router + (spec.num_experts + spec.shared_experts) * expert_params(spec)


def layer_params(spec: ModelSpec, layer: int) -> int:
    """All parameters of decoder layer `layer` (1-based), as transformers counts them."""
    norms = 2 * spec.hidden_size
    return (
        attention_matmul_params(spec)
        + attention_other_params(spec)
        + mlp_params(spec, layer)
        + norms
    )


def active_matmul_params(spec: ModelSpec, layer: int) -> int:
    """Matmul weights one token multiplies in layer `layer` (FLOPs = 2 x this per token)."""
    attn = attention_matmul_params(spec)
    if not is_moe_layer(spec, layer):
        return attn + 3 * spec.hidden_size * spec.intermediate_size
    router = spec.num_experts * spec.hidden_size
    return attn + router + (spec.experts_per_token + spec.shared_experts) * expert_params(spec)


def active_params(spec: ModelSpec) -> int:
    """Parameters one token uses: every layer's active weights, norms, embedding row, head."""
    body = sum(
        layer_params(spec, i) - mlp_params(spec, i) + _active_mlp(spec, i)
        for i in range(1, spec.num_layers + 1)
    )
    return body + spec.final_norm_params + spec.embedding_params + spec.lm_head_params


def _active_mlp(spec: ModelSpec, layer: int) -> int:
    attn = attention_matmul_params(spec)
    return active_matmul_params(spec, layer) - attn


def layer_elementwise_bytes(spec: ModelSpec, layer: int, batch: int, seq: int) -> int:
    """HBM traffic of one layer's forward outside matmuls and attention. Dense layers:
    `ModelSpec.layer_elementwise_bytes`. MoE layers replace the dense SwiGLU (6 B per
    intermediate unit) by the routed and shared experts' (topk + shared) x moe_intermediate
    units, and add the token permutation: every routed copy of a token (h BF16 values) is
    written and read once to dispatch and once to combine (8 h B per copy), and the router's
    FP32 scores are written, read for top-k and read for the softmax (12 B per expert)."""
    dense = spec.layer_elementwise_bytes(batch, seq)
    if not is_moe_layer(spec, layer):
        return dense
    per_token = -6 * spec.intermediate_size
    per_token += 6 * (spec.experts_per_token + spec.shared_experts) * spec.moe_intermediate_size
    per_token += 8 * spec.experts_per_token * spec.hidden_size + 12 * spec.num_experts
    return dense + batch * seq * per_token


def layer_fwd_flops(spec: ModelSpec, layer: int, batch: int, seq: int) -> float:
    """Forward FLOPs of decoder layer `layer`: 2 per active matmul weight per token + attention."""
    linear = 2.0 * batch * seq * active_matmul_params(spec, layer)
    return linear + attention_fwd_flops(spec, batch, seq)
