"""Multi-GPU layouts on paper: the knobs (TP, PP, CP, EP, DP, ZeRO, CPU Adam, recompute), the
rules a layout must obey, and the small closed formulas every other layout module uses.

Rules (`check_layout` refuses the first one broken, naming it and the valid values):
- dense layers: N = TP x PP x CP x DP;
- expert layers (expert TP = 1): N divisible by EP x PP; experts divisible by EP; EP = 1 on a
  dense model;
- heads divisible by TP; KV heads divisible by TP, or TP a multiple of them (then replicated);
- layers divisible by PP (even stages), or an explicit split `pp_layers` (one count per stage,
  each >= 1, summing to the layers);
- virtual stages v > 1 (interleaved 1F1B): PP > 1, m a multiple of PP (Megatron's interleaved
  order), and every stage holds at least v layers (v - 1 on the first and last stage, whose
  first / last chunk may hold only the embedding / the head, as Llama 3 did);
- TP at most the GPUs of one node and dividing them (keep TP on NVLink);
- CP > 1: the sequence splits into 2 x CP equal chunks (zigzag), so seq divisible by 2 x CP;
  or, with `cp_comm = "allgather"` (the packed token stream split contiguously, each rank
  all-gathering the whole K and V before its attention, Megatron's `--cp-comm-type allgather`
  as Llama 3 trained), into CP contiguous chunks: seq divisible by CP;
- global batch divisible by DP x micro-batch size (m = B / (DP x mbs) micro-batches per step);
- ZeRO stage 0-3, or the distributed optimizer (shards master + moments and the update, then
  all-gathers weights: ZeRO-1's memory), not both;
- recompute is full (`recompute`) or selective (`recompute_modules`, Megatron's
  `--recompute-granularity selective --recompute-modules ...`: `layernorm`, `moe_act`, `moe`),
  not both; `moe_act` and `moe` need an MoE model.

Rank order is Megatron's default, TP fastest, then CP, DP, PP: a group of size g and stride s
spans s x g consecutive ranks and stays on NVLink when that fits one node. Expert groups with
expert TP = 1 are EP consecutive ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from slide_ir.specs.model import ModelSpec

# Megatron's selective recompute modules that slide prices (`--recompute-modules`, documented at
# `TransformerConfig.recompute_modules`, megatron/core/transformer/transformer_config.py): the two
# RMSNorms before attention and MLP; the experts' SwiGLU activation; the whole MoE block (router,
# dispatch, experts, combine: its all-to-all re-runs).
RECOMPUTE_MODULES = ("layernorm", "moe_act", "moe")
# How CP ranks see the other ranks' keys and values: a zigzag ring (overlapped with attention),
# or an all-gather of the contiguous chunks (exposed, and the whole K/V held; see ledger.py).
CP_COMMS = ("zigzag", "allgather")


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One way to spread a training step over `gpus` GPUs. `dp` is derived when 0."""

    gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 0
    zero: int = 0
    distributed_optimizer: bool = False
    cpu_adam: bool = False
    recompute: bool = False
    seq: int = 4096
    micro_batch_size: int = 1
    global_batch: int = 0  # sequences per step; 0: micro_batches x DP x micro_batch_size
    micro_batches: int = 0  # m per pipeline per step; 0: derived from global_batch (or = PP)
    pp_layers: tuple[int, ...] = ()  # decoder layers per stage; (): L / PP each
    virtual_stages: int = 1  # v model chunks per stage (interleaved 1F1B when > 1)
    deepep: bool = False  # EP dispatch deduplicated per node (DeepEP), see layout_cost
    recompute_modules: tuple[str, ...] = ()  # selective recompute, see RECOMPUTE_MODULES
    cp_comm: str = "zigzag"  # see CP_COMMS

    def __post_init__(self) -> None:
        for name in ("gpus", "tp", "pp", "cp", "ep", "seq", "micro_batch_size", "virtual_stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {v!r}")
        for name in ("dp", "global_batch", "micro_batches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 1 (0: derived); got {v!r}")
        if not isinstance(self.pp_layers, tuple) or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.pp_layers
        ):
            raise ValueError(f"pp_layers must be a tuple of integers >= 1; got {self.pp_layers!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3; got {self.zero!r}")
        if not isinstance(self.recompute_modules, tuple) or any(
            m not in RECOMPUTE_MODULES for m in self.recompute_modules
        ):
            raise ValueError(
                f"recompute_modules must be a tuple of {', '.join(RECOMPUTE_MODULES)}; "
                f"got {self.recompute_modules!r}"
            )
        if self.cp_comm not in CP_COMMS:
            raise ValueError(f"cp_comm must be one of {', '.join(CP_COMMS)}; got {self.cp_comm!r}")
        if self.recompute and self.recompute_modules:
            raise ValueError("full recompute and recompute_modules (selective) exclude each other")
        if self.zero and self.distributed_optimizer:
            raise ValueError(
                f"--zero {self.zero} and --distributed-optimizer both shard the optimizer: pick one"
            )

    @property
    def data_parallel(self) -> int:
        return self.dp or max(self.gpus // (self.tp * self.pp * self.cp), 1)

    @property
    def batch(self) -> int:
        """Sequences per step."""
        if self.global_batch:
            return self.global_batch
        m = self.micro_batches or self.pp
        return m * self.data_parallel * self.micro_batch_size

    @property
    def m(self) -> int:
        """Micro-batches per pipeline per step."""
        return self.batch // (self.data_parallel * self.micro_batch_size)

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert (expert TP = 1): N / (EP x PP)."""
        return self.gpus // (self.ep * self.pp)

    @property
    def optimizer_shards(self) -> bool:
        return self.zero >= 1 or self.distributed_optimizer

    def describe(self) -> str:
        opt = f"zero{self.zero}" if not self.distributed_optimizer else "dist-opt"
        extras = "".join(
            name
            for name, on in ((" cpu-adam", self.cpu_adam), (" recompute", self.recompute),
                             (" deepep", self.deepep))
            if on
        )  # fmt: skip
        if self.cp_comm != "zigzag":
            extras += f" cp-{self.cp_comm}"
        if self.recompute_modules:
            extras += f" recompute({','.join(self.recompute_modules)})"
        split = f"[{','.join(map(str, self.pp_layers))}]" if self.pp_layers else ""
        virtual = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        return (
            f"TP{self.tp} PP{self.pp}{split}{virtual} CP{self.cp} EP{self.ep} "
            f"DP{self.data_parallel} {opt}{extras} m={self.m}"
        )


def check_layout(spec: ModelSpec, layout: Layout, gpus_per_node: int) -> None:
    """Raise ValueError naming the first rule `layout` breaks (see the module docstring)."""
    for problem in layout_problems(spec, layout, gpus_per_node):
        raise ValueError(problem)


def layout_problems(spec: ModelSpec, lay: Layout, gpus_per_node: int) -> list[str]:
    """Every rule broken, one line each, in the order of the module docstring."""
    n, tp, pp, cp, ep, dp = lay.gpus, lay.tp, lay.pp, lay.cp, lay.ep, lay.data_parallel
    out = []
    if tp * pp * cp * dp != n:
        out.append(
            f"dense layers need N = TP x PP x CP x DP: {tp} x {pp} x {cp} x {dp} = "
            f"{tp * pp * cp * dp}, not --gpus {n}"
        )
    if n % (ep * pp):
        out.append(f"expert layers need N divisible by EP x PP = {ep * pp}; --gpus is {n}")
    if not spec.is_moe and ep != 1:
        out.append(f"--ep must be 1 for the dense model {spec.name}; got {ep}")
    if spec.is_moe and spec.num_experts % ep:
        out.append(f"--ep must divide the {spec.num_experts} experts of {spec.name}; got {ep}")
    if spec.num_heads % tp:
        out.append(f"--tp must divide the {spec.num_heads} attention heads; got {tp}")
    kv = spec.num_kv_heads
    if kv % tp and tp % kv:
        out.append(f"--tp must divide the {kv} KV heads or be a multiple of them; got {tp}")
    out += _stage_problems(spec, lay)
    if tp > gpus_per_node or gpus_per_node % tp:
        out.append(f"--tp must divide the {gpus_per_node} GPUs of a node (TP on NVLink); got {tp}")
    if not spec.is_moe and {"moe", "moe_act"} & set(lay.recompute_modules):
        out.append(f"--recompute-modules moe / moe_act need an MoE model; {spec.name} is dense")
    if cp > 1 and lay.cp_comm == "zigzag" and lay.seq % (2 * cp):
        out.append(f"--seq must be divisible by 2 x CP = {2 * cp} (zigzag chunks); got {lay.seq}")
    if cp > 1 and lay.cp_comm == "allgather" and lay.seq % cp:
        out.append(f"--seq must be divisible by CP = {cp} (contiguous chunks); got {lay.seq}")
    if lay.batch % (dp * lay.micro_batch_size) or lay.m < 1:
        out.append(
            f"--global-batch must be a multiple of DP x micro-batch = "
            f"{dp * lay.micro_batch_size}; got {lay.batch}"
        )
    return out


def _stage_problems(spec: ModelSpec, lay: Layout) -> list[str]:
    pp, v, layers = lay.pp, lay.virtual_stages, spec.num_layers
    if pp > layers:
        return [f"--pp must be at most the {layers} layers (a stage needs one); got {pp}"]
    if lay.pp_layers:
        if len(lay.pp_layers) != pp or sum(lay.pp_layers) != layers:
            return [f"--pp-layers must give {pp} stage sizes summing to the {layers} layers; "
                    f"got {','.join(map(str, lay.pp_layers))}"]  # fmt: skip
    elif layers % pp:
        example = ",".join(map(str, balanced_split(layers, pp)))
        return [f"--pp must divide the {layers} layers (even stages), or give the split, e.g. "
                f"--pp-layers {example}; got --pp {pp}"]  # fmt: skip
    if v == 1:
        return []
    if pp == 1:
        return [f"--virtual-stages {v} needs --pp > 1 (chunks interleave over stages)"]
    out = []
    if lay.m % pp:
        out.append(
            f"--virtual-stages needs m a multiple of PP = {pp} (interleaved 1F1B); m = {lay.m}"
        )
    split = stage_sizes(spec, lay)
    ends = {0, pp - 1}
    short = [s for s, n in enumerate(split) if n < v - (s in ends)]
    if short:
        out.append(f"--virtual-stages {v}: stage {short[0]} holds {split[short[0]]} layers, fewer "
                   f"than its {v} chunks (v - 1 allowed on the first and last stage)")  # fmt: skip
    return out


def balanced_split(layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage as even as possible; the remainder goes to the middle stages first, since
    the first and last stage also hold the embedding and the head (e.g. 78 on 8: 9,10,...,10,9)."""
    base, extra = divmod(layers, pp)
    order = [*range(1, pp - 1), 0, pp - 1] if pp > 2 else list(range(pp))
    bonus = set(order[:extra])
    return tuple(base + (s in bonus) for s in range(pp))


def stage_sizes(spec: ModelSpec, lay: Layout) -> tuple[int, ...]:
    """Decoder layers of each pipeline stage: the explicit split, else L / PP each."""
    return lay.pp_layers or (spec.num_layers // lay.pp,) * lay.pp


def bubble(pp: int, m: int, v: int = 1) -> float:
    """Idle share of a pipeline: (p - 1) / (v m + p - 1); utilisation v m / (v m + p - 1). v = 1
    is plain 1F1B; with v interleaved chunks per stage the fill and drain shrink v-fold
    (Narayanan et al. 2021: bubble time (p - 1) / (v m) of the ideal)."""
    return (pp - 1) / (v * m + pp - 1)


def in_flight_chunks(pp: int, m: int, v: int, stage: int) -> int:
    """Forward passes whose activations stage `stage` holds at once: 1F1B's min(p - s, m) micro-
    batches; interleaved (v > 1), Megatron's warm-up of 2 (p - s - 1) + (v - 1) p chunks plus
    the one in progress, at most all m v chunks. Each chunk holds 1/v of the stage's layers."""
    if v == 1:
        return min(pp - stage, m)
    return min(2 * (pp - stage - 1) + (v - 1) * pp + 1, m * v)


def _pairs_upto(q: int) -> int:
    """Causal (query, key) pairs of queries 0..q-1: query i sees keys 0..i, i + 1 pairs."""
    return q * (q + 1) // 2


def cp_pair_counts(seq: int, cp: int, *, zigzag: bool) -> list[int]:
    """Causal (query, key) pairs each CP rank computes, diagonal included.

    Contiguous: rank r holds tokens [r s/c, (r+1) s/c). Zigzag: 2c chunks, rank r holds chunks
    r and 2c - r - 1. E.g. seq 8, CP 2: contiguous 10 and 26, zigzag 18 and 18.
    """
    if zigzag:
        if seq % (2 * cp):
            raise ValueError(f"seq must be divisible by 2 x CP = {2 * cp}; got {seq}")
        c = seq // (2 * cp)
        chunks: list[tuple[int, ...]] = [(r, 2 * cp - r - 1) for r in range(cp)]
    else:
        if seq % cp:
            raise ValueError(f"seq must be divisible by CP = {cp}; got {seq}")
        c = seq // cp
        chunks = [(r,) for r in range(cp)]
    return [sum(_pairs_upto((k + 1) * c) - _pairs_upto(k * c) for k in ks) for ks in chunks]


def cp_imbalance(seq: int, cp: int, *, zigzag: bool = True) -> float:
    """Slowest rank's attention work over the mean (1.0 = balanced): zigzag, or contiguous
    chunks (allgather CP on one packed sequence: the last rank's queries see every key)."""
    if cp == 1:
        return 1.0
    counts = cp_pair_counts(seq, cp, zigzag=zigzag)
    return max(counts) * cp / sum(counts)


def group_on_nvlink(stride: int, size: int, gpus_per_node: int) -> bool:
    """Whether a group of `size` ranks `stride` apart fits inside one node."""
    return stride * size <= gpus_per_node


def strides(lay: Layout) -> dict[str, int]:
    """Rank stride of each dimension's group (TP fastest, then CP, DP, PP; EP consecutive)."""
    return {
        "tp": 1,
        "cp": lay.tp,
        "dp": lay.tp * lay.cp,
        "pp": lay.tp * lay.cp * lay.data_parallel,
        "ep": 1,
    }
