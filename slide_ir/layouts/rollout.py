"""Rollout engines on paper: an engine layout, its rules, its KV cache and its memory ledger.

An engine (one SGLang/vLLM server) spans `gpus` GPUs G: attention runs tensor-parallel over
`tp` of them and data-parallel over G / TP groups (DP attention: each group keeps the KV of its
own sequences); routed experts are split over `ep` ranks, each expert over G / EP of them
(expert TP). A pool of N rollout GPUs holds N / G engines.

Rules (`engine_problems` lists every one broken, in this order):
- G divides the pool's N GPUs; TP divides G;
- TP divides the attention heads; the KV heads divisible by TP, or TP a multiple of them (then
  each GPU keeps a replica, as vLLM does);
- TP at most the GPUs of a node and dividing them (TP on NVLink);
- TP divides the (dense) intermediate size;
- dense model: EP = 1; MoE: EP divides the experts and G; expert TP = G / EP divides the
  experts' intermediate size.

KV cache per token and layer on one GPU, `kv_bytes_per_token` (d the KV dtype's bytes, 2 for
BF16, 1 for FP8):
- GQA: K and V of the KV heads it keeps, 2 x max(KV heads / TP, 1) x head dim x d;
- MLA (DeepSeek-V3, GLM-5): one compressed latent per token, (kv_lora_rank + qk_rope_head_dim)
  x d, whole on every TP rank (heads are expanded from it in the kernel; vLLM's and SGLang's
  MLA caches store only it, so TP does not split it: the reason they run DP attention);
- DeepSeek sparse attention (GLM-5) adds the indexer's key, index_head_dim x d.
A sequence of c tokens keeps layers x min(c, sliding window) tokens of it.

Ledger per GPU (`EngineLedger`), named terms:
    weights    BF16 x (non-expert params / TP + routed-expert params / G)
    kv_cache   ceil(b / (G / TP)) sequences x layers x (prompt + response) x KV per token:
               every in-flight sequence at its full length, what the scheduler must hold so no
               request is preempted; samples sharing a prompt are counted apart (an upper bound:
               the radix cache shares their prefix)
    workspace  one prefill chunk's transient tensors, C x (4 h + (q + 2 kv) / TP + 3 I_local)
               x 2 B (hidden in/out/residual/norm; q/k/v; gate, up and their product, I_local =
               I / TP dense, or k x moe I x EP / G routed), plus the decode batch's FP32 logits,
               b x vocab / TP x 4 B. C = 8192 tokens, chunked prefill's default
               (Mini-SGLang `--max-prefill-length` 8192,
               https://www.mintlify.com/sgl-project/mini-sglang/configuration/server-options)
    allocator  f / (1 - f) x workspace, f = `FRAGMENTATION` (GMLake, as the training ledger):
               the KV is one pre-allocated paged pool and weights are allocated once, so only
               the churning workspace fragments
    context    the CUDA context, `CUDA_CONTEXT_BYTES`
The KV budget is the capacity less every other term; the batch it allows is
(G / TP) x floor(budget / KV per sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slide_ir.layouts.cluster import Cluster
from slide_ir.layouts.ledger import FRAGMENTATION
from slide_ir.layouts.work import BF16, FP32
from slide_ir.planning.compute_terms import CUDA_CONTEXT_BYTES
from slide_ir.specs import moe
from slide_ir.specs.model import ModelSpec

KV_DTYPES = {"bf16": 2, "fp8": 1}
PREFILL_CHUNK = 8192  # tokens per chunked-prefill step (see the module docstring)
ENGINE_TERMS = ("weights", "kv_cache", "workspace", "allocator", "context")
_FIXED = ("weights", "workspace", "allocator", "context")


def _positive(owner: object, names: tuple[str, ...], low: int = 1) -> None:
    for name in names:
        v = getattr(owner, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {v!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Engine:
    """One inference engine: G GPUs, attention TP (DP over G / TP), expert EP, KV precision."""

    gpus: int
    tp: int = 1
    ep: int = 1
    kv_dtype: str = "bf16"

    def __post_init__(self) -> None:
        _positive(self, ("gpus", "tp", "ep"))
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"kv_dtype must be one of {', '.join(KV_DTYPES)}; got {self.kv_dtype!r}"
            )

    @property
    def attention_dp(self) -> int:
        """Attention data-parallel groups: G / TP, each with its own sequences' KV."""
        return max(self.gpus // self.tp, 1)

    def describe(self) -> str:
        return f"{self.gpus}-GPU engine TP{self.tp} DP{self.attention_dp} EP{self.ep} KV {self.kv_dtype}"


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutWork:
    """One rollout round: `prompts` x `samples` sequences of prompt + response tokens.
    `concurrency`: sequences in flight per engine; 0: as many as the KV budget allows."""

    prompts: int = 8
    samples: int = 8
    prompt_len: int = 1024
    response_len: int = 8192
    concurrency: int = 0

    def __post_init__(self) -> None:
        _positive(self, ("prompts", "samples", "prompt_len", "response_len"))
        _positive(self, ("concurrency",), low=0)

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def context(self) -> int:
        """Tokens a sequence holds at its end."""
        return self.prompt_len + self.response_len

    def per_engine(self, engines: int) -> int:
        """Sequences each of `engines` engines serves in a round (the busiest one)."""
        return -(-self.sequences // engines)


def engine_problems(spec: ModelSpec, eng: Engine, pool_gpus: int, gpus_per_node: int) -> list[str]:
    """Every rule `eng` breaks on a pool of `pool_gpus` GPUs, one line each (module docstring)."""
    g, tp, out = eng.gpus, eng.tp, []
    if pool_gpus % g:
        out.append(f"--engine-gpus must divide the {pool_gpus} rollout GPUs; got {g}")
    if g % tp:
        out.append(f"--engine-tp must divide the {g} GPUs of an engine (DP attention over the "
                   f"rest); got {tp}")  # fmt: skip
    if spec.num_heads % tp:
        out.append(f"--engine-tp must divide the {spec.num_heads} attention heads; got {tp}")
    kv = spec.num_kv_heads
    if kv % tp and tp % kv:
        out.append(f"--engine-tp must divide the {kv} KV heads or be a multiple of them; got {tp}")
    if tp > gpus_per_node or gpus_per_node % tp:
        out.append(f"--engine-tp must divide the {gpus_per_node} GPUs of a node (TP on NVLink); "
                   f"got {tp}")  # fmt: skip
    if spec.intermediate_size % tp:
        out.append(f"--engine-tp must divide the intermediate size {spec.intermediate_size}; "
                   f"got {tp}")  # fmt: skip
    out += _expert_problems(spec, eng)
    return out


def _expert_problems(spec: ModelSpec, eng: Engine) -> list[str]:
    g, ep = eng.gpus, eng.ep
    if not spec.is_moe:
        return (
            [] if ep == 1 else [f"--engine-ep must be 1 for the dense model {spec.name}; got {ep}"]
        )
    out = []
    if spec.num_experts % ep:
        out.append(
            f"--engine-ep must divide the {spec.num_experts} experts of {spec.name}; got {ep}"
        )
    if g % ep:
        out.append(f"--engine-ep must divide the {g} GPUs of an engine; got {ep}")
    elif spec.moe_intermediate_size % (g // ep):
        out.append(f"expert TP = engine GPUs / EP = {g // ep} must divide the experts' "
                   f"intermediate size {spec.moe_intermediate_size}")  # fmt: skip
    return out


def check_engine(spec: ModelSpec, eng: Engine, pool_gpus: int, gpus_per_node: int) -> None:
    """Raise ValueError naming the first rule `eng` breaks."""
    for problem in engine_problems(spec, eng, pool_gpus, gpus_per_node):
        raise ValueError(problem)


def kv_bytes_per_token(spec: ModelSpec, eng: Engine) -> int:
    """KV bytes one GPU keeps per token and layer (module docstring: GQA, MLA, sparse MLA)."""
    d = KV_DTYPES[eng.kv_dtype]
    if spec.kv_lora_rank:
        return (spec.kv_lora_rank + spec.qk_rope_head_dim + moe.dsa_indexer(spec)[2]) * d
    heads = max(spec.num_kv_heads // eng.tp, 1)
    return 2 * heads * spec.head_dim * d


def kv_bytes_per_sequence(spec: ModelSpec, eng: Engine, tokens: int) -> int:
    """KV bytes one GPU keeps for a sequence of `tokens` tokens, all layers."""
    kept = tokens if spec.sliding_window is None else min(tokens, spec.sliding_window)
    return spec.num_layers * kept * kv_bytes_per_token(spec, eng)


def expert_params(spec: ModelSpec) -> int:
    """Routed-expert parameters of the whole model (what EP x expert TP splits over G)."""
    return sum(moe.routed_expert_params(spec, i) for i in range(1, spec.num_layers + 1))


def weight_bytes(spec: ModelSpec, eng: Engine) -> int:
    """BF16 weights on one GPU: non-expert ones over TP, routed experts over all G GPUs."""
    routed = expert_params(spec)
    return BF16 * (-(-(spec.total_params - routed) // eng.tp) + -(-routed // eng.gpus))


def workspace_bytes(spec: ModelSpec, eng: Engine, batch: int) -> int:
    """One prefill chunk's transient tensors plus the decode batch's FP32 logits (docstring)."""
    h, tp = spec.hidden_size, eng.tp
    qkv = (spec.q_dim + 2 * spec.kv_dim) // tp
    if spec.is_moe:
        mlp = spec.experts_per_token * spec.moe_intermediate_size * eng.ep // eng.gpus
    else:
        mlp = spec.intermediate_size // tp
    chunk = PREFILL_CHUNK * (4 * h + qkv + 3 * mlp) * BF16
    return chunk + batch * -(-spec.vocab_size // tp) * FP32


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineLedger:
    """One GPU of an engine: named terms for `batch` sequences in flight, and the KV budget."""

    gpu_terms: tuple[tuple[str, int], ...]
    gpu_capacity: int
    batch: int  # sequences in flight per engine the terms are for
    requested: int  # sequences asked for per engine (concurrency, or the round's share)
    kv_per_sequence: int  # bytes on one GPU for one sequence at its full length
    max_batch: int  # sequences per engine the KV budget allows

    @property
    def gpu_bytes(self) -> int:
        return sum(b for _, b in self.gpu_terms)

    @property
    def fits(self) -> bool:
        return self.gpu_bytes <= self.gpu_capacity and self.batch >= 1

    def term(self, name: str) -> int:
        return dict(self.gpu_terms)[name]

    @property
    def kv_budget(self) -> int:
        """Bytes left for the KV cache once every other term is placed."""
        return self.gpu_capacity - sum(self.term(k) for k in _FIXED)

    def overflow(self) -> str:
        """Which term does not fit and by how much; '' when it fits."""
        if self.fits:
            return ""
        gib = 2**30
        if self.kv_budget < self.kv_per_sequence:
            fixed = {k: self.term(k) for k in _FIXED}
            worst = max(fixed, key=lambda k: fixed[k])
            return (f"{worst} overflows: {worst} {fixed[worst] / gib:.1f} GiB leaves "
                    f"{max(self.kv_budget, 0) / gib:.1f} GiB per GPU, less than one sequence's "
                    f"KV ({self.kv_per_sequence / gib:.2f} GiB)")  # fmt: skip
        return (f"kv_cache overflows: {self.batch} sequences need "
                f"{self.term('kv_cache') / gib:.1f} GiB per GPU, {self.kv_budget / gib:.1f} GiB "
                f"left after weights, workspace and reserve; at most {self.max_batch} fit")  # fmt: skip


def build_engine_ledger(
    spec: ModelSpec, eng: Engine, work: RolloutWork, cluster: Cluster, engines: int
) -> EngineLedger:
    """The ledger of one GPU of the busiest of `engines` engines. With `concurrency` 0 the batch
    is the round's share capped by the KV budget (so it fits when one sequence does)."""
    per_seq = kv_bytes_per_sequence(spec, eng, work.context)
    requested = work.concurrency or work.per_engine(engines)
    fixed = {"weights": weight_bytes(spec, eng), "workspace": workspace_bytes(spec, eng, requested)}
    fixed["allocator"] = int(fixed["workspace"] * FRAGMENTATION / (1 - FRAGMENTATION))
    fixed["context"] = CUDA_CONTEXT_BYTES
    budget = cluster.gpu_memory_bytes - sum(fixed.values())
    max_batch = eng.attention_dp * max(budget, 0) // per_seq
    batch = requested if work.concurrency else min(requested, max_batch)
    kv = -(-max(batch, 1) // eng.attention_dp) * per_seq
    terms = {**fixed, "kv_cache": kv}
    return EngineLedger(
        gpu_terms=tuple((k, terms[k]) for k in ENGINE_TERMS),
        gpu_capacity=cluster.gpu_memory_bytes,
        batch=batch,
        requested=requested,
        kv_per_sequence=per_seq,
        max_batch=max_batch,
    )


def _variants(
    spec: ModelSpec, eng: Engine, work: RolloutWork
) -> list[tuple[str, Engine, RolloutWork]]:
    """Single changes that shrink an engine's memory: more TP, more GPUs per engine, FP8 KV."""
    out = [
        (
            f"--engine-tp {2 * eng.tp}",
            replace(eng, tp=2 * eng.tp, gpus=max(eng.gpus, 2 * eng.tp)),
            work,
        )
    ]
    ep = 2 * eng.ep if spec.is_moe and eng.ep == eng.gpus else eng.ep
    out.append((f"--engine-gpus {2 * eng.gpus}", replace(eng, gpus=2 * eng.gpus, ep=ep), work))
    if eng.kv_dtype != "fp8":
        out.append(("--kv-dtype fp8", replace(eng, kv_dtype="fp8"), work))
    return out


def engine_advice(
    spec: ModelSpec, eng: Engine, work: RolloutWork, cluster: Cluster, pool_gpus: int
) -> list[str]:
    """What would make an overflowing engine fit: each single change that breaks no rule,
    re-planned (the ones that fit first), and the concurrency the KV budget allows."""
    engines = pool_gpus // eng.gpus
    base = build_engine_ledger(spec, eng, work, cluster, engines)
    rows: list[tuple[bool, int, str]] = []
    for flag, e, w in _variants(spec, eng, work):
        if engine_problems(spec, e, pool_gpus, cluster.gpus_per_node):
            continue
        led = build_engine_ledger(spec, e, w, cluster, pool_gpus // e.gpus)
        saved = base.gpu_bytes - led.gpu_bytes
        verdict = "fits" if led.fits else "still over"
        rows.append((led.fits, saved, f"{flag}: {saved / 2**30:+.1f} GiB per GPU, {verdict}"))
    rows.sort(key=lambda r: (not r[0], -r[1]))
    out = [text for _, _, text in rows]
    if work.concurrency and base.max_batch >= 1:
        out.append(f"--concurrency {base.max_batch}: the most sequences per engine the KV fits")
    return out
