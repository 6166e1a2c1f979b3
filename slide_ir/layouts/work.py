"""What one GPU of each pipeline stage holds and does per micro-batch: parameters, FLOPs,
activation bytes and collective message sizes. Physical units only (never seconds).

Per GPU of stage s (its layers from `stage_sizes`: L/p each or the explicit split; the embedding
on the first stage, final norm and LM head on the last):
- parameters: non-expert ones / TP, routed experts / EP (expert TP = 1);
- FLOPs per micro-batch: every active FLOP of the stage / (TP x CP): TP splits the matmuls,
  CP the tokens, EP only moves tokens (balanced routing assumed); attention FLOPs are also
  multiplied by the zigzag imbalance (slowest CP rank);
- activations: `activation_terms` per token, / (TP x CP) (sequence parallelism shards norms
  and residuals too).

Messages per micro-batch (bytes, BF16 activations), the full logical tensor of each collective:
- TP: one all-reduce-equivalent per tensor-parallel block per pass (with sequence parallelism
  an all-gather + reduce-scatter of tokens/CP x hidden moves the same bytes): the attention of
  every layer, the MLP of dense layers only (routed and shared experts run with expert TP = 1
  on the sequence-parallel shard, so an MoE block needs no TP collective), the vocab-parallel
  embedding on the first stage and the LM head's gather on the last;
- CP: a ring exchange of K and V, (CP - 1) rounds of one rank's chunk (forward); backward sends
  K, V and their gradients (2x); what moves per token is `_cp_kv`'s. allgather CP moves the same
  bytes (an all-gather of the CP chunks, a reduce-scatter of their gradients) but holds the
  whole sequence's K and V of a layer at once (`cp_gather_bytes`), and its contiguous chunks
  give the last rank the most attention pairs (`cp_imbalance(..., zigzag=False)`);
- EP: dispatch + combine all-to-all of local tokens x experts-per-token x hidden per MoE layer
  and pass;
- PP: one send of the stage's output activations (tokens/(TP x CP) x hidden), one of its grad;
- DP: the stage's gradients once per step (FP32 as kept), reduce-scattered (sharded optimizer)
  or all-reduced; weights (BF16) all-gathered after a sharded update.
"""

from __future__ import annotations

from dataclasses import dataclass

from slide_ir.layouts.plan import Layout, cp_imbalance, stage_sizes
from slide_ir.specs import moe
from slide_ir.specs.model import ModelSpec

BF16, FP32 = 2, 4


def stage_layers(spec: ModelSpec, lay: Layout, stage: int) -> range:
    """Decoder layers (1-based) of pipeline stage `stage` (0-based)."""
    sizes = stage_sizes(spec, lay)
    first = sum(sizes[:stage]) + 1
    return range(first, first + sizes[stage])


def activation_terms(spec: ModelSpec, layer: int) -> dict[str, int]:
    """Bytes autograd keeps per token for one layer's backward (no recompute), unsharded.

    Attention block: norm output, q/k/v, q/k after RoPE, attention output, FP32 logsumexp
    per head, both norms' FP32 rstd, residual, second norm output, layer output. MLP: gate and
    up, their SwiGLU product; MoE layer: FP32 router scores, and per routed copy the permuted
    input, gate/up and product, plus the shared experts' gate/up/product.
    """
    h, q = spec.hidden_size, spec.num_heads * spec.head_dim
    k, v = (q, moe.v_dim(spec)) if spec.kv_lora_rank else (spec.kv_dim, spec.kv_dim)
    terms = {
        "norm1.out": h * BF16,
        "qkv": (q + k + v) * BF16,
        "qk.rope": (q + k) * BF16,
        "attn.out": spec.num_heads * (spec.v_head_dim or spec.head_dim) * BF16,
        "attn.lse": spec.num_heads * FP32,
        "norm.rstd": 2 * FP32,
        "resid": h * BF16,
        "norm2.out": h * BF16,
        "out": h * BF16,
    }
    if spec.kv_lora_rank:  # MLA keeps the compressed q and kv it expands
        terms["mla.latent"] = (spec.q_lora_rank + spec.kv_lora_rank) * BF16
    if not moe.is_moe_layer(spec, layer):
        terms["mlp"] = 3 * spec.intermediate_size * BF16
        return terms
    im, k, shared = spec.moe_intermediate_size, spec.experts_per_token, spec.shared_experts
    terms["router"] = spec.num_experts * FP32
    terms["experts.in"] = k * h * BF16  # the permuted input of each routed copy
    terms["experts.fc1"] = k * 2 * im * BF16  # gate and up
    terms["experts.act"] = k * im * BF16  # their SwiGLU product
    terms["shared.fc1"] = shared * 2 * im * BF16
    terms["shared.act"] = shared * im * BF16
    return terms


def recomputed_terms(spec: ModelSpec, layer: int, modules: tuple[str, ...]) -> frozenset[str]:
    """The `activation_terms` selective recompute drops (recomputes in the backward) in one layer.
    Megatron's modules (`TransformerConfig.recompute_modules`): `layernorm` discards the outputs
    of input_layernorm and pre_mlp_layernorm (recomputed from the residual stream, which is kept);
    `moe_act` discards the experts' SwiGLU product (recomputed from gate and up, which are kept);
    `moe` checkpoints the whole MoE layer: only its input is kept (the second norm's output, or
    its input under `layernorm`), the router scores and every expert tensor are recomputed."""
    out: set[str] = set()
    if "layernorm" in modules:
        out |= {"norm1.out", "norm2.out"}
    if not moe.is_moe_layer(spec, layer):
        return frozenset(out)
    if "moe_act" in modules:
        out |= {"experts.act", "shared.act"}
    if "moe" in modules:
        out |= {"router", "experts.in", "experts.fc1", "experts.act", "shared.fc1", "shared.act"}
    return frozenset(out)


def recompute_bytes_per_token(spec: ModelSpec, layer: int, modules: tuple[str, ...]) -> int:
    """HBM bytes per token of the elementwise recompute `modules` add to one layer's backward,
    outside the MoE block's own forward (priced as such under `moe`): an RMSNorm reads its BF16
    input and writes its output (4 h B; the FP32 rstd is kept); a SwiGLU product reads gate and
    up and writes the product (6 B per intermediate unit, as `layer_elementwise_bytes`)."""
    extra = 2 * 4 * spec.hidden_size if "layernorm" in modules else 0
    if moe.is_moe_layer(spec, layer) and "moe_act" in modules and "moe" not in modules:
        extra += 6 * (spec.experts_per_token + spec.shared_experts) * spec.moe_intermediate_size
    return extra


def moe_block_fwd(spec: ModelSpec, layer: int, batch: int, seq: int) -> tuple[float, int]:
    """(FLOPs, elementwise HBM bytes) of one MoE layer's MoE block forward (router, routed and
    shared experts, token permutation; the parts `layer_elementwise_bytes` adds for it), zero on
    a dense layer: what `moe` recompute runs a second time."""
    if not moe.is_moe_layer(spec, layer):
        return 0.0, 0
    k, shared, im = spec.experts_per_token, spec.shared_experts, spec.moe_intermediate_size
    params = spec.num_experts * spec.hidden_size + (k + shared) * moe.expert_params(spec)
    per_token = 6 * (k + shared) * im + 8 * k * spec.hidden_size + 12 * spec.num_experts
    return 2.0 * batch * seq * params, batch * seq * per_token


@dataclass(frozen=True, kw_only=True, slots=True)
class Gemm:
    """`count` GEMMs of one GPU per micro-batch: (M x K) @ (K x N), M the tokens it runs."""

    m: float
    k: int
    n: int
    count: int
    moe: bool = False  # in the MoE block (what `moe` recompute runs again)


def stage_gemms(spec: ModelSpec, lay: Layout, layers: range, last: bool) -> tuple[Gemm, ...]:
    """The weight GEMMs one GPU of a stage runs per micro-batch, for `LayoutCosts.gemm_excess`.
    Non-expert matmuls see the micro-batch's tokens over CP (sequence parallelism gathers them
    over TP) and 1/TP of each weight, counted as one GEMM of K = hidden per layer (attention,
    router and dense MLP weights together; the LM head likewise); routed experts see
    M = tokens/(TP x CP) x top-k x EP / experts rows each (balanced routing), fc1 (hidden x 2
    intermediate: gate and up) and fc2 (intermediate x hidden); shared experts the GPU's own
    tokens with whole weights (expert TP = 1)."""
    h, tokens = spec.hidden_size, lay.micro_batch_size * lay.seq / lay.cp
    dense = sum(moe.active_matmul_params(spec, i) for i in layers)
    n_moe = sum(moe.is_moe_layer(spec, i) for i in layers)
    dense -= n_moe * (spec.experts_per_token + spec.shared_experts) * moe.expert_params(spec)
    out = [Gemm(m=tokens, k=h, n=max(dense // (h * lay.tp * max(len(layers), 1)), 1),
                count=len(layers))]  # fmt: skip
    if last:
        out.append(Gemm(m=tokens, k=h, n=-(-spec.vocab_size // lay.tp), count=1))
    if n_moe:
        im, local = spec.moe_intermediate_size, tokens / lay.tp
        per_expert = local * spec.experts_per_token * lay.ep / spec.num_experts
        experts = n_moe * (spec.num_experts // lay.ep)
        out += [Gemm(m=per_expert, k=h, n=2 * im, count=experts, moe=True),
                Gemm(m=per_expert, k=im, n=h, count=experts, moe=True)]  # fmt: skip
        if spec.shared_experts:
            wide = im * spec.shared_experts
            out += [Gemm(m=local, k=h, n=2 * wide, count=n_moe, moe=True),
                    Gemm(m=local, k=wide, n=h, count=n_moe, moe=True)]  # fmt: skip
    return tuple(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageWork:
    """One GPU of one pipeline stage, per micro-batch unless named per step."""

    stage: int
    layers: int
    moe_layers: int
    dense_params: int  # this GPU's share of non-expert weights
    expert_params: int  # this GPU's share of routed-expert weights
    fwd_flops: float
    fwd_attn_flops: float
    fwd_bytes: int  # elementwise HBM traffic of the forward
    act_bytes: int  # kept for backward per micro-batch (all layers; less what selective drops)
    input_bytes: int  # layer inputs kept per micro-batch under recompute
    layer_peak_bytes: int  # one layer's saved tensors: the recompute working set
    recompute_peak_bytes: int  # one layer's tensors selective recompute regenerates (0: none)
    re_flops: float  # selective recompute: the MoE blocks' forward again (`moe`), per micro-batch
    re_bytes: int  # selective recompute: its elementwise HBM traffic
    re_ep_bytes: int  # selective recompute: the EP all-to-all bytes it re-runs (`moe`)
    gemms: tuple[Gemm, ...]  # weight GEMMs per micro-batch, for the roofline of small M
    logits_bytes: int  # last stage: logits, FP32 copy and gradient
    tp_blocks: int  # tensor-parallel blocks (one collective each per pass)
    tp_bytes: int  # TP collective message per pass (all layers)
    cp_bytes: int  # CP ring bytes sent per rank in the forward
    ep_bytes: int  # EP all-to-all bytes per rank per pass
    pp_bytes: int  # activation (or gradient) sent to the neighbour stage
    cp_gather_bytes: int = 0  # allgather CP: one layer's gathered K and V (whole sequence)

    @property
    def params(self) -> int:
        return self.dense_params + self.expert_params


def stage_work(spec: ModelSpec, lay: Layout, stage: int) -> StageWork:
    layers = stage_layers(spec, lay, stage)
    b, s, split = lay.micro_batch_size, lay.seq, lay.tp * lay.cp
    tokens = b * s
    dense = sum(moe.layer_params(spec, i) - moe.routed_expert_params(spec, i) for i in layers)
    experts = sum(moe.routed_expert_params(spec, i) for i in layers)
    last = stage == lay.pp - 1
    if stage == 0:
        dense += spec.embedding_params
    if last:
        dense += spec.final_norm_params + spec.lm_head_params
    attn = moe.attention_fwd_flops(spec, b, s) * len(layers)
    linear = sum(2.0 * tokens * moe.active_matmul_params(spec, i) for i in layers)
    if last:
        linear += spec.head_fwd_flops(b, s)
    modules = lay.recompute_modules
    per_layer_act, per_layer_re = [], []
    re_flops, re_bytes = 0.0, 0
    for i in layers:
        terms, dropped = activation_terms(spec, i), recomputed_terms(spec, i, modules)
        per_layer_act.append(sum(v for k, v in terms.items() if k not in dropped) * tokens // split)
        per_layer_re.append(sum(terms[k] for k in dropped) * tokens // split)
        if "moe" in modules:
            flops, nbytes = moe_block_fwd(spec, i, b, s)
            re_flops, re_bytes = re_flops + flops, re_bytes + nbytes
        re_bytes += tokens * recompute_bytes_per_token(spec, i, modules)
    hidden_local = tokens * spec.hidden_size * BF16 // split
    n_moe = sum(moe.is_moe_layer(spec, i) for i in layers)
    tp_blocks = 2 * len(layers) - n_moe + (stage == 0) + last  # attention, dense MLP, embed, head
    kv_per_token, kv_split = _cp_kv(spec, lay.tp)
    imbalance = cp_imbalance(s, lay.cp, zigzag=lay.cp_comm == "zigzag")
    gathered = lay.cp > 1 and lay.cp_comm == "allgather"
    return StageWork(
        stage=stage,
        layers=len(layers),
        moe_layers=n_moe,
        dense_params=-(-dense // lay.tp),
        expert_params=-(-experts // lay.ep),
        fwd_flops=(linear + attn * imbalance) / split,
        fwd_attn_flops=attn * imbalance / split,
        fwd_bytes=sum(moe.layer_elementwise_bytes(spec, i, b, s) for i in layers) // split,
        act_bytes=sum(per_layer_act),
        input_bytes=hidden_local * len(layers),
        layer_peak_bytes=max(per_layer_act),
        recompute_peak_bytes=max(per_layer_re),
        re_flops=re_flops / split,
        re_bytes=re_bytes // split,
        re_ep_bytes=2 * n_moe * spec.experts_per_token * hidden_local
        if lay.ep > 1 and "moe" in modules
        else 0,
        gemms=stage_gemms(spec, lay, layers, last),
        logits_bytes=tokens // lay.cp * -(-spec.vocab_size // lay.tp) * 10 if last else 0,
        tp_blocks=tp_blocks if lay.tp > 1 else 0,
        tp_bytes=tp_blocks * tokens // lay.cp * spec.hidden_size * BF16 if lay.tp > 1 else 0,
        cp_bytes=(lay.cp - 1) * len(layers) * tokens // lay.cp * kv_per_token // kv_split,
        ep_bytes=2 * n_moe * spec.experts_per_token * hidden_local if lay.ep > 1 else 0,
        pp_bytes=hidden_local if lay.pp > 1 else 0,
        cp_gather_bytes=tokens * kv_per_token // kv_split if gathered else 0,
    )


def _cp_kv(spec: ModelSpec, tp: int) -> tuple[int, int]:
    """(bytes per token the CP ring moves, the TP split of them). GQA: K and V of the KV heads,
    split by TP up to the KV heads. MLA: expanded K and V of every head, split by TP (ring
    attention on the expanded heads). Sparse MLA (DSA) runs in MQA mode: every head attends to
    the one compressed latent (kv_lora_rank + rope dims) per token, which is what moves, whole."""
    if moe.dsa_indexer(spec)[0]:
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * BF16, 1
    if spec.kv_lora_rank:
        return (spec.num_heads * spec.head_dim + moe.v_dim(spec)) * BF16, tp
    return 2 * spec.kv_dim * BF16, min(tp, spec.num_kv_heads)


def all_stages(spec: ModelSpec, lay: Layout) -> list[StageWork]:
    return [stage_work(spec, lay, s) for s in range(lay.pp)]


def model_flops_per_step(spec: ModelSpec, lay: Layout) -> float:
    """Model FLOPs of one step (forward + 2x backward, no recompute), all GPUs together."""
    b, s = lay.micro_batch_size, lay.seq
    fwd = sum(moe.layer_fwd_flops(spec, i, b, s) for i in range(1, spec.num_layers + 1))
    fwd += spec.head_fwd_flops(b, s)
    return 3 * fwd * lay.batch / b
