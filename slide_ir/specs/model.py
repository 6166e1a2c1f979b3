"""ModelSpec: a decoder-only transformer's shape, and what one layer costs in params, FLOPs, bytes.

Built from a Hugging Face config.json (`slide_ir.specs.hf_config` reads one; a file, a model
directory, or a built-in catalog entry in `catalog/models/<name>.json`, which
`slide_ir.specs.model_catalog.load_model` finds), so planner, simulator and executor all read one
description.

Invariants:
- All decoder layers are identical (llama, mistral, qwen2, qwen3 without sliding-window layer
  mixes), so every per-layer figure is one number, and totals are `num_layers` times it.
- `total_params` equals `sum(p.numel() for p in model.parameters())` of the transformers model built
  from the same config (tied embeddings counted once); the tests hold it to that, exactly.
- FLOPs and bytes are physical work at (batch, seq), never seconds: the CostModel rates them.
- The raw config is kept (`to_hf_config()`), so the executor builds its layers from the same dict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from slide_ir.specs import moe
from slide_ir.specs.dtypes import DTYPE_BYTES as DTYPE_BYTES  # re-exported: model.DTYPE_BYTES
from slide_ir.specs.dtypes import dtype_bytes
from slide_ir.specs.moe import check as moe_check

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Mixture-of-experts architectures: planned on paper by `slide layout` (slide_ir.specs.moe reads their
# configs); the executor builds only SUPPORTED_MODEL_TYPES, and `load_model` refuses these.
MOE_MODEL_TYPES = ("qwen3_moe", "glm4_moe", "deepseek_v3", "glm_moe_dsa")
# Counts that are 0 on a dense model (MoE and multi-head latent attention shapes).
_ZERO_OK = frozenset({"num_experts", "experts_per_token", "shared_experts",
                      "moe_intermediate_size", "dense_layers", "q_lora_rank", "kv_lora_rank",
                      "qk_rope_head_dim", "v_head_dim"})  # fmt: skip
_BF16, _FP32 = 2, 4
LCE_BYTES_PER_LOGIT = 6  # the fused loss's row kernel: two bf16 reads and one write per logit


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """One decoder-only model: its shape, and the per-layer costs the planner needs.

    Bias flags follow transformers: qwen2 has q/k/v bias (no o_proj bias); llama's
    `attention_bias` puts a bias on q/k/v *and* o_proj; qwen3 likewise; mistral has none.
    `sliding_window` (mistral only) limits how far back each query attends.
    """

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    max_position_embeddings: int = 4096
    sliding_window: int | None = None
    hidden_act: str = "silu"
    # Mixture of experts (all 0 on a dense model): routed experts per MoE layer, experts each
    # token is routed to, always-active shared experts, one expert's FFN width, and how many
    # leading decoder layers keep the dense MLP (`first_k_dense_replace`).
    num_experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate_size: int = 0
    dense_layers: int = 0
    # Multi-head latent attention (DeepSeek; 0 = plain GQA): `head_dim` is then the q/k head
    # width (nope + rope) and `v_head_dim` the value head width.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    source: str = ""
    hf_config_json: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be a non-empty string")
        if self.model_type not in SUPPORTED_MODEL_TYPES + MOE_MODEL_TYPES:
            raise ValueError(
                f"model_type must be one of {', '.join(SUPPORTED_MODEL_TYPES)} "
                f"(or, for layout planning only, {', '.join(MOE_MODEL_TYPES)})"
            )
        for f in (f.name for f in fields(self) if f.type == "int"):  # sizes and counts
            v, low = getattr(self, f), 0 if f in _ZERO_OK else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{f} must be an integer >= {low}; got {v!r}")
        moe_check(self)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads must divide num_heads ({self.num_heads}); got {self.num_kv_heads}"
            )
        if not 0.0 < self.rms_norm_eps < 1.0:
            raise ValueError(f"rms_norm_eps must be in (0, 1); got {self.rms_norm_eps!r}")
        if not self.rope_theta > 0.0:
            raise ValueError(f"rope_theta must be > 0; got {self.rope_theta!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be None or >= 1; got {self.sliding_window!r}")

    # --- constructors -----------------------------------------------------------------------

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any], *, name: str, origin: str = "<config>"
    ) -> ModelSpec:
        """Read a HF config dict; `origin` (a file path) is named in every error message."""
        from slide_ir.specs.hf_config import spec_from_config  # it imports this module

        return spec_from_config(config, name=name, origin=origin)

    def to_hf_config(self) -> dict[str, Any]:
        """The HF config dict to build the transformers model from (keys starting `_` dropped).

        A spec built by hand, with no stored config, gets one synthesised from its fields.
        """
        if not self.hf_config_json:
            from slide_ir.specs.hf_config import synth_hf_config  # it imports this module

            return synth_hf_config(self)
        raw: dict[str, Any] = json.loads(self.hf_config_json)
        return {k: v for k, v in raw.items() if not k.startswith("_")}

    # --- parameters ---------------------------------------------------------------------------

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def layer_matmul_params(self) -> int:
        """Weights of the 7 linears (q, k, v, o, gate, up, down): the ones that cost 2 FLOPs/token.

        MoE: the weights one token multiplies in an MoE layer (attention, router, its
        `experts_per_token` routed experts and the shared ones), so FLOPs follow active params.
        """
        if self.is_moe or self.q_lora_rank or self.kv_lora_rank:
            return moe.active_matmul_params(self, self.num_layers)
        attn = self.hidden_size * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden_size
        return attn + 3 * self.hidden_size * self.intermediate_size

    @property
    def layer_params(self) -> int:
        """All parameters of one decoder layer: linears, biases, RMSNorm weights.

        MoE: the largest layer (an MoE layer, every expert counted: memory follows total
        params); `slide_ir.specs.moe.layer_params(spec, i)` gives each layer's own count.
        """
        if self.is_moe or self.q_lora_rank or self.kv_lora_rank:
            return max(moe.layer_params(self, i) for i in (1, self.num_layers))
        h, i = self.hidden_size, self.intermediate_size
        biases = (self.q_dim + 2 * self.kv_dim) * self.attention_bias
        biases += h * self.o_proj_bias + (2 * i + h) * self.mlp_bias
        norms = 2 * h + 2 * self.head_dim * self.qk_norm  # input/post-attn, + q_norm/k_norm
        return self.layer_matmul_params + biases + norms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """0 when tied: the head reuses the embedding matrix (still a matmul, see head FLOPs)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        return self.hidden_size

    @property
    def total_params(self) -> int:
        if self.is_moe or self.q_lora_rank or self.kv_lora_rank:
            body = sum(moe.layer_params(self, i) for i in range(1, self.num_layers + 1))
            return body + self.final_norm_params + self.embedding_params + self.lm_head_params
        body = self.num_layers * self.layer_params + self.final_norm_params
        return body + self.embedding_params + self.lm_head_params

    @property
    def flops_per_token_6n(self) -> int:
        """The standard 6N training FLOPs per token estimate (no attention term), for reports."""
        return 6 * self.total_params

    def layer_bytes(self, dtype: str) -> int:
        """Bytes of one layer's parameters in `dtype` ("fp32", "bf16", "fp16")."""
        return self.layer_params * dtype_bytes(dtype)

    # --- FLOPs --------------------------------------------------------------------------------

    def linear_fwd_flops(self, batch: int, seq: int) -> float:
        """2 FLOPs (multiply + add) per matmul weight per token; biases and norms ignored."""
        return float(2 * batch * seq * self.layer_matmul_params)

    def attention_fwd_flops(self, batch: int, seq: int) -> float:
        """QK^T and AV: 2 matmuls x 2*b*h*(query, key pairs)*head_dim.

        Causal: only the pairs with key <= query are computed (what FlashAttention does), counted
        as s^2/2 per head, the usual convention (diagonal blocks' waste ignored). With a sliding
        window w < s, pairs are s*w - w^2/2. Softmax, scaling and masking are ignored.
        """
        s, w = seq, self.sliding_window
        pairs = s * s / 2 if w is None or w >= s else s * w - w * w / 2
        v_dim = self.v_head_dim or self.head_dim  # MLA: QK^T at head_dim, AV at v_head_dim
        return 2 * batch * self.num_heads * pairs * (self.head_dim + v_dim)

    def layer_fwd_flops(self, batch: int, seq: int) -> float:
        """Forward FLOPs of one layer (also the cost of its recompute under checkpointing)."""
        return self.linear_fwd_flops(batch, seq) + self.attention_fwd_flops(batch, seq)

    def layer_elementwise_bytes(self, batch: int, seq: int) -> int:
        """HBM traffic of one layer's forward outside the matmuls and attention, BF16: two
        RMSNorms (read x, write y: 4h B/token each), RoPE on q and k (read + write: 4(q+kv) B),
        v's copy out of the projection (4kv B), SwiGLU (read gate and up, write the product: 6I
        B), two residual adds (read 2, write 1: 12h B). The backward moves about twice this. Norm
        weights and rstd are ignored."""
        per_token = 8 * self.hidden_size + 4 * (self.q_dim + 2 * self.kv_dim)
        per_token += 6 * self.intermediate_size + 12 * self.hidden_size
        return batch * seq * per_token

    def head_elementwise_bytes(self, batch: int, seq: int) -> int:
        """HBM traffic of the fused loss outside its GEMMs (`slide_kernels.lce`, bf16 logits): the
        row kernel reads each chunk's logits twice (the log-sum-exp, then the gradient) and
        writes their gradient over them, 6 B per logit; the GEMMs' own reads and writes of the
        logits are theirs (`Gemm.bytes`)."""
        return LCE_BYTES_PER_LOGIT * batch * seq * self.vocab_size

    def layer_bwd_flops(self, batch: int, seq: int) -> float:
        """Backward = 2x forward (input grad + weight grad per matmul), attention included.

        Model-FLOPs convention: FlashAttention's backward really runs 5 matmuls to the forward's 2
        (it recomputes QK^T), i.e. 2.5x; that extra half is hardware work, not model work, and is
        left to the CostModel's efficiency factor. Recompute is a separate op (`layer_fwd_flops`).
        """
        return 2 * self.layer_fwd_flops(batch, seq)

    def head_fwd_flops(self, batch: int, seq: int) -> float:
        """LM head matmul (tied or not): 2*tokens*hidden*vocab; softmax/loss elementwise ignored."""
        return float(2 * batch * seq * self.hidden_size * self.vocab_size)

    def head_bwd_flops(self, batch: int, seq: int) -> float:
        return 2 * self.head_fwd_flops(batch, seq)

    # --- activation bytes -----------------------------------------------------------------------

    def layer_input_bytes(self, batch: int, seq: int) -> int:
        """The checkpoint kept per layer between forward and backward: its bf16 input."""
        return batch * seq * self.hidden_size * _BF16

    def layer_saved_terms(self, batch: int, seq: int) -> dict[str, int]:
        """Bytes autograd keeps for one layer's recomputed forward (checkpoint input excluded).

        Assumes the executor's layer (`executor.layers.decoder_layer_taped`): fused RMSNorm
        (saves its input + fp32 rstd), one q/k/v projection whose output is freed once RoPE
        (out of place, saves only cos/sin, a few KB, ignored) and a copy of v have read it,
        FlashAttention (saves q, k, v, out, fp32 logsumexp) and the gate|up projection's output,
        from which the backward recomputes the SwiGLU product (the down projection's input); the
        product and the layer's output are not part of the tape (the backward starts from a root
        that holds no data). On the H200 (2026-11-30) a recomputed layer held exactly these bytes
        plus the product, the output and q/k/v's projection but v (llama-3.2-3b, llama-3.1-8b,
        qwen3-8b; `bench/memory/layer_memory.py`, bench/RESULTS.md); without them it is not yet
        measured.
        """
        t, h, i = batch * seq, self.hidden_size, self.intermediate_size
        terms = {
            "norm1.out": t * h * _BF16,  # input of q/k/v proj, kept for their weight grads
            "norm.rstd": 2 * t * _FP32,  # 1/rms per token, both RMSNorms
            "v": t * self.kv_dim * _BF16,  # v, copied out of the q/k/v projection's output
            "qk.rope": t * (self.q_dim + self.kv_dim) * _BF16,  # post-RoPE q and k, for FA
            "attn.out": t * self.q_dim * _BF16,  # FA output = o_proj input (one tensor)
            "attn.lse": batch * self.num_heads * seq * _FP32,  # FA logsumexp per (head, query)
            "resid": t * h * _BF16,  # x + o_proj(attn): input of the post-attention norm
            "norm2.out": t * h * _BF16,  # input of gate/up proj
            "mlp.gate_up": 2 * t * i * _BF16,  # gate|up, for the SwiGLU's and down_proj's backward
        }
        if self.qk_norm:  # qwen3: per-head RMSNorm on q and k keeps its input and rstd
            kv_rows = self.num_heads + self.num_kv_heads
            terms["qk_norm"] = t * (self.q_dim + self.kv_dim) * _BF16 + t * kv_rows * _FP32
        return terms

    def layer_tape_bytes(self, batch: int, seq: int) -> int:
        """What a layer's forward keeps for its backward when it records its own tape (no
        recompute): the saved tensors of `layer_saved_terms` plus a copy of its input, which
        the first RMSNorm saves (the input's slot is reused meanwhile)."""
        return self.layer_input_bytes(batch, seq) + sum(self.layer_saved_terms(batch, seq).values())

    def layer_transient_bytes(self, batch: int, seq: int) -> int:
        """Peak activation bytes inside one layer during recompute + backward, bf16.

        Saved tensors (`layer_saved_terms`) plus the gradient buffers alive at the worst of two
        moments; weight grads land in the cache-unit slot, and the incoming gradient d_out and
        d_x in the hidden-gradient slots (ledger terms of their own), so neither counts here.
        - SwiGLU backward: the recomputed product has gone into down_proj's weight gradient and
          been freed; alive are d_prod, the SwiGLU's gradient d(gate|up) and that weight
          gradient (H x I), which the MLP tail's backward returns for autograd to add into the
          cache unit's slot.
        - Attention backward: the MLP's tensors are freed; alive are d_resid, d_attn_out,
          dq/dk/dv and FlashAttention-2's fp32 dq accumulator plus its fp32 row scratch.
        For every catalog model the SwiGLU moment is the larger (intermediate >= 2.3 x hidden).
        Measured on an H100 (2026-12-06, `bench/memory/layer_memory.py`, the lean tape): 1.830
        GiB for llama-3.2-3b at 16 x 1024 tokens (this: 1.830), 5.395 at 48 x 1024 (5.395),
        2.986 for llama-3.1-8b (2.986), 2.817 for qwen3-8b (2.817).
        """
        t, h, i = batch * seq, self.hidden_size, self.intermediate_size
        saved = self.layer_saved_terms(batch, seq)
        total = sum(saved.values())
        mlp_peak = total + (t * 3 * i + h * i) * _BF16
        mlp_saved = (
            saved["resid"]
            + saved["norm2.out"]
            + sum(v for k, v in saved.items() if k.startswith("mlp."))
        )
        attn_grads = t * (h + 2 * self.q_dim + 2 * self.kv_dim) * _BF16
        fa_scratch = t * self.q_dim * _FP32 + saved["attn.lse"]
        attn_peak = total - mlp_saved + attn_grads + fa_scratch
        return max(mlp_peak, attn_peak)

    def logits_bytes(
        self, batch: int, seq: int, *, fused: bool, chunk_tokens: int | None = None
    ) -> int:
        """Peak bytes of the LM head + cross-entropy stage.

        Unfused: bf16 logits + their fp32 upcast for a stable softmax + fp32 grad of the logits:
        tokens*vocab*(2+4+4). Fused chunked linear-cross-entropy (`slide_kernels.lce`): one chunk's
        bf16 logits at a time, their gradient written over them: chunk*vocab*2, chunk capped at
        the batch's token count.
        """
        tokens = batch * seq
        if not fused:
            return tokens * self.vocab_size * (_BF16 + _FP32 + _FP32)
        if chunk_tokens is None or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be an integer >= 1 when fused; got {chunk_tokens}")
        return min(chunk_tokens, tokens) * self.vocab_size * _BF16

    def default_lce_chunk_tokens(self, budget_bytes: int) -> int:
        """Largest power-of-two chunk whose bf16 logits fit `budget_bytes` (>= 1).

        A chunk of c tokens needs c*vocab*2 bytes; e.g. vocab 128256 and 512 MiB:
        2^29 / (128256*2) = 2093.1 -> 2048 tokens. Powers of two keep kernel tiles full.
        """
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0; got {budget_bytes}")
        fit = budget_bytes // (self.vocab_size * _BF16)
        return 1 << (fit.bit_length() - 1) if fit >= 1 else 1
