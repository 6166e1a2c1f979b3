"""The per-GPU memory ledger of a layout, by named terms, and host RAM per node.

Model state per parameter (`StateBytes`, default 2 + 4 + 4 + 8 = 18 B: BF16 weights, FP32
gradients, FP32 master, two FP32 moments) is sharded like ZeRO over D replicas
(`slide_ir.planning.ledger.zero_bytes_per_gpu`): non-expert weights over D = DP x CP, routed experts
over their own replicas N / (EP x PP). The distributed optimizer shards master + moments (ZeRO-1's
memory). CPU Adam moves master + moments to host RAM, plus an FP32 landing copy of the
gradient shard; activations are unaffected.

Activations per GPU: 1F1B keeps up to PP - s micro-batches in flight on stage s (0-based; at
most m); each holds every layer's saved tensors, or under recompute only each layer's input,
plus one layer's working set; under selective recompute (`Layout.recompute_modules`) the saved
tensors less those the modules regenerate (`work.recomputed_terms`), plus one layer's worth of
them. Interleaved (v chunks per stage) keeps Megatron's warm-up
2 (p - s - 1) + (v - 1) p + 1 chunks in flight (`in_flight_chunks`), each 1/v of the stage. The last stage adds the logits (BF16, their FP32 copy and
gradient). Communication buffers: send + receive staging of the largest message. allgather CP
(`Layout.cp_comm`) adds `cp_gathered`: one layer's K and V gathered over the whole sequence
and, in its backward, their gradients before the reduce-scatter, 2 x `cp_gather_bytes` (the
zigzag ring holds only its chunks in flight, inside the attention kernel's working set: 0).
Fragmentation:
the caching allocator cannot reuse all it reserves for tensors that come and go (activations,
logits, message staging); GMLake (Guo et al., ASPLOS 2024, arXiv 2401.08156) measured PyTorch's
allocator wasting 15% of reserved memory on average (up to 33%) over eight LLM training setups
with recompute, offload and ZeRO on A100-80GB, so these terms get f / (1 - f) on top, f = 0.15.
Weights, gradients and optimizer state sit in buffers allocated once (Megatron's contiguous
parameter and gradient buffers) and get none. Reserve: the CUDA context (as the single-GPU
ledger). Everything is per GPU of the worst stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slide_ir.layouts.cluster import Cluster
from slide_ir.layouts.plan import Layout, in_flight_chunks, layout_problems
from slide_ir.layouts.work import FP32, StageWork, all_stages
from slide_ir.planning.compute_terms import CUDA_CONTEXT_BYTES
from slide_ir.planning.ledger import StateBytes
from slide_ir.specs.model import ModelSpec

_DEFAULT_SIZES = StateBytes()
GPU_TERMS = ("weights", "gradients", "master", "moments", "activations", "logits",
             "comm_buffers", "cp_gathered", "fragmentation", "reserve")  # fmt: skip
FRAGMENTATION = 0.15  # share of reserved memory the allocator wastes on churning tensors (GMLake)


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutLedger:
    stage: int  # the stage whose GPU needs the most
    gpu_terms: tuple[tuple[str, int], ...]
    gpu_capacity: int
    host_per_node: int
    host_capacity: int
    in_flight: int  # forward chunks (micro-batches when v = 1) whose activations it keeps

    @property
    def gpu_bytes(self) -> int:
        return sum(b for _, b in self.gpu_terms)

    @property
    def fits(self) -> bool:
        return self.gpu_bytes <= self.gpu_capacity and self.host_per_node <= self.host_capacity

    def term(self, name: str) -> int:
        return dict(self.gpu_terms)[name]


def _state(params: int, shards: int, lay: Layout, sizes: StateBytes) -> dict[str, int]:
    """Model-state bytes of `params` on one GPU, sharded over `shards` replicas."""
    opt_sharded = lay.optimizer_shards

    def part(size: int, sharded: bool) -> int:
        return -(-size * params // shards) if sharded else size * params

    return {
        "weights": part(sizes.weights, lay.zero >= 3),
        "gradients": part(sizes.grads, lay.zero >= 2),
        "master": part(sizes.master, opt_sharded),
        "moments": part(sizes.moments, opt_sharded),
    }


def stage_terms(
    work: StageWork, lay: Layout, sizes: StateBytes = _DEFAULT_SIZES
) -> tuple[dict[str, int], int, int]:
    """(GPU terms, host bytes, micro-batches in flight) for one GPU of stage `work.stage`."""
    dense = _state(work.dense_params, lay.data_parallel * lay.cp, lay, sizes)
    experts = _state(work.expert_params, lay.expert_dp, lay, sizes)
    terms = {k: dense[k] + experts[k] for k in dense}
    host = 0
    if lay.cpu_adam:  # master + moments and an FP32 gradient landing copy go to the host
        host = terms["master"] + terms["moments"]
        host += -(-FP32 * work.params // (lay.data_parallel if lay.optimizer_shards else 1))
        terms["master"] = terms["moments"] = 0
    v = lay.virtual_stages
    in_flight = in_flight_chunks(lay.pp, lay.m, v, work.stage)
    kept = work.input_bytes if lay.recompute else work.act_bytes
    working = work.layer_peak_bytes if lay.recompute else work.recompute_peak_bytes
    terms["activations"] = -(-in_flight * kept // v) + working
    terms["logits"] = work.logits_bytes
    per_call = (  # one collective's message: TP per block, EP per dispatch or combine
        work.tp_bytes // max(work.tp_blocks, 1),
        work.ep_bytes // max(2 * work.moe_layers, 1),
        work.pp_bytes,
    )
    largest = max(per_call)
    terms["comm_buffers"] = 2 * largest
    terms["cp_gathered"] = 2 * work.cp_gather_bytes
    churn = terms["activations"] + terms["logits"] + terms["comm_buffers"] + terms["cp_gathered"]
    terms["fragmentation"] = int(churn * FRAGMENTATION / (1 - FRAGMENTATION))
    terms["reserve"] = CUDA_CONTEXT_BYTES
    return terms, host, in_flight


def build_layout_ledger(
    spec: ModelSpec, lay: Layout, cluster: Cluster, sizes: StateBytes = _DEFAULT_SIZES
) -> LayoutLedger:
    """The ledger of the stage whose GPU needs the most."""
    best: tuple[int, dict[str, int], int, int] | None = None
    host_max = 0
    for work in all_stages(spec, lay):
        terms, host, in_flight = stage_terms(work, lay, sizes)
        host_max = max(host_max, host)
        if best is None or sum(terms.values()) > sum(best[1].values()):
            best = (work.stage, terms, host, in_flight)
    assert best is not None
    return LayoutLedger(
        stage=best[0],
        gpu_terms=tuple((k, best[1][k]) for k in GPU_TERMS),
        gpu_capacity=cluster.gpu_memory_bytes,
        host_per_node=host_max * cluster.gpus_per_node,
        host_capacity=cluster.host_ram_bytes,
        in_flight=best[3],
    )


_KNOBS: tuple[tuple[str, dict[str, object]], ...] = (
    ("--recompute", {"recompute": True}),
    ("--distributed-optimizer", {"distributed_optimizer": True, "zero": 0}),
    ("--zero 2", {"zero": 2, "distributed_optimizer": False}),
    ("--zero 3", {"zero": 3, "distributed_optimizer": False}),
    ("--cpu-adam", {"cpu_adam": True}),
)


def advice(spec: ModelSpec, lay: Layout, cluster: Cluster) -> list[str]:
    """What would make an overflowing layout fit: each single knob, or doubling one of
    TP / PP / CP at the same GPU count (halving DP), re-planned; the ones that fit first."""
    base = build_layout_ledger(spec, lay, cluster)
    options: list[tuple[bool, int, str]] = []
    for flag, change in _KNOBS:
        if all(getattr(lay, k) == v for k, v in change.items()):
            continue
        _try(spec, replace(lay, **change), cluster, flag, base, options)  # type: ignore[arg-type]
    for dim in ("tp", "pp", "cp"):
        dp = lay.data_parallel
        if dp % 2 == 0:
            bigger = replace(lay, **{dim: getattr(lay, dim) * 2}, dp=dp // 2)
            if not layout_problems(spec, bigger, cluster.gpus_per_node):
                _try(spec, bigger, cluster, f"--{dim} {getattr(bigger, dim)}", base, options)
    options.sort(key=lambda o: (not o[0], -o[1]))
    return [text for _, _, text in options]


def _try(
    spec: ModelSpec,
    lay: Layout,
    cluster: Cluster,
    flag: str,
    base: LayoutLedger,
    out: list[tuple[bool, int, str]],
) -> None:
    led = build_layout_ledger(spec, lay, cluster)
    saved = base.gpu_bytes - led.gpu_bytes
    if saved <= 0 and not (led.fits and not base.fits):
        return
    verdict = "fits" if led.fits else "still over"
    out.append((led.fits, saved, f"{flag}: {saved / 2**30:+.1f} GiB per GPU saved, {verdict}"))
