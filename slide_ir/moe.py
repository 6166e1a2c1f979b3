"""Mixture-of-experts and multi-head latent attention shapes: per-layer parameters and FLOPs.

A `ModelSpec` with `num_experts > 0` (qwen3_moe, glm4_moe, deepseek_v3) has decoder layers that
differ: the first `dense_layers` keep a dense SwiGLU MLP (`intermediate_size`), the rest are MoE
layers (a router, `num_experts` routed experts of width `moe_intermediate_size`, `shared_experts`
always-active ones). DeepSeek's multi-head latent attention (MLA, `kv_lora_rank > 0`) replaces
q/k/v projections by low-rank ones.

Invariants:
- Counts follow transformers' modules exactly (`sum(p.numel() for p in model.parameters())`;
  the router's `e_score_correction_bias` is a buffer there, not a parameter, and is not counted;
  nor are DeepSeek/GLM multi-token-prediction layers, which transformers does not build).
- Memory follows total parameters; FLOPs follow the parameters one token multiplies
  (`active_matmul_params`): attention, router, `experts_per_token` routed + the shared experts.
- Layers are numbered 1..num_layers as in op ids (0 is the embedding).

Pure functions of the spec; `slide_ir.model` imports this module, so it imports nothing of it
at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slide_ir.model import ModelSpec

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
    return q + kv + heads * spec.v_head_dim * h


def attention_other_params(spec: ModelSpec) -> int:
    """Attention biases and norms: q/k/v (and o) biases, per-head q/k norms, MLA's two norms."""
    if spec.kv_lora_rank:  # q_a/kv_a layernorms; q_a, kv_a and o biases when attention_bias
        norms = spec.q_lora_rank + spec.kv_lora_rank
        bias = spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_head_dim + spec.hidden_size
        return norms + bias * spec.attention_bias
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


def layer_fwd_flops(spec: ModelSpec, layer: int, batch: int, seq: int) -> float:
    """Forward FLOPs of decoder layer `layer`: 2 per active matmul weight per token + attention."""
    linear = 2.0 * batch * seq * active_matmul_params(spec, layer)
    return linear + spec.attention_fwd_flops(batch, seq)
