"""Data-parallel sliding on one node: rank r's schedule, derived from the single-GPU plan.

N ranks each slide their own window over the same layers on their own slice of the global
batch (batch / N). The planner plans one rank at that batch, its placement searched as the
ranks run it (`plan_data_parallel`, `plan(..., nproc=N)`); `shard_plan` then rewrites its graph
into rank r's (`sharding.shard_graph`):

- every unit's FP32 master and moments (and what holds them on their way: landing buffers,
  pinned BF16 copies, accumulators, NVMe stripes, streamed state slots) are split by element
  range (`shard_range`): rank r owns elements [r c, min((r + 1) c, q)) of a unit of q, c =
  ceil(q / N), padded to N c for the collectives (NCCL's reduce-scatter wants equal parts);
- backward: before a unit's gradient is read by its consumer (the `d2h` download, or a GPU
  AdamW), a `reduce_scatter` on the `net` lane sums it over the ranks and leaves each rank its
  shard; the download, the host AdamW, its FP32 accumulation and NVMe traffic move 1/N;
- forward: each rank uploads only its shard of the new BF16 weights (h2d / N) and an
  `all_gather` on `net` assembles the unit in its cache slot; every op that waited for the
  upload waits for the all-gather instead;
- resident units keep their BF16 weights and gradients whole on every GPU (the compute needs
  them) but their FP32 state sharded: reduce-scatter, a GPU AdamW of the rank's 1/N, an
  all-gather of the new weights. Chosen over an all-reduce and N identical updates: the same
  bytes on the link (an all-reduce is a reduce-scatter plus an all-gather), 1/N of the update
  and of the 12 B/param of state on each GPU. Streamed units: reduce-scatter, GPU AdamW of the
  shard, shard of the new weights down; the next step's upload all-gathers as above.

Work is the rank's (rank 0 holds the largest shard, so its graph is the slowest); a
collective's `work.bytes` is the whole message (N padded shards), as `OpKind` says. The ledger
per rank is the plan's terms with the sharded pools resized (`RankTerm`); per host, N ranks'
host terms: the optimizer state stays ~12 B/param in total, the per-process terms (runtime,
landing buffers' padding) grow with N. N = 1 returns the plan's graph unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slide_ir.ir.graph import Graph, Op, OpKind
from slide_ir.planning.planner import Plan, plan
from slide_ir.planning.sharding import (
    rank_overflows,
    shard_graph,
)
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

K = OpKind
DEFAULT_GPUS_PER_NODE = 8  # a node's usual count, where the machine profile states none


@dataclass(frozen=True, kw_only=True, slots=True)
class RankTerm:
    """One ledger term as a rank holds it: `bytes` after sharding, `single` the plan's."""

    name: str
    label: str
    tier: str  # report tier: gpu, cpu (pinned included), nvme
    bytes: int
    single: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelPlan:
    """Rank `rank`'s plan of N: the single-GPU plan at batch / N, its graph sharded."""

    base: Plan  # the single-GPU plan of one rank (its config's batch is the rank's)
    nproc: int
    rank: int
    graph: Graph
    terms: tuple[RankTerm, ...]

    @property
    def global_batch(self) -> int:
        return self.base.config.batch * self.nproc

    def rank_bytes(self, tier: str) -> int:
        """Bytes one rank holds on `tier` (gpu: its GPU; cpu: its process's host RAM)."""
        return sum(t.bytes for t in self.terms if t.tier == tier)

    def host_bytes(self, tier: str) -> int:
        """Bytes of every rank of the node together (host RAM, NVMe)."""
        return self.nproc * self.rank_bytes(tier)

    def capacity_bytes(self, tier: str) -> int:
        return self.base.ledger.capacity_bytes(tier)

    def overflows(self) -> list[tuple[str, int]]:
        """(tier, bytes over): the GPU per rank, host RAM and NVMe per host (`rank_overflows`)."""
        return rank_overflows(self.base.ledger, self.base.model, self.nproc)

    @property
    def feasible(self) -> bool:
        return not self.overflows()

    def net_bytes_per_step(self) -> int:
        """Bytes this rank sends on `net` in one step: (N - 1) / N of each ring message."""
        steps = max(1, self.graph.info.steps)
        sent = sum(_ring_sent(op, self.nproc) for op in self.graph.ops if op.lane == "net")
        return sent // steps

    def summary(self) -> dict[str, object]:
        """JSON-ready figures of the data-parallel plan (the `nproc` part of plan output)."""
        return {
            "nproc": self.nproc,
            "rank": self.rank,
            "global_batch": self.global_batch,
            "rank_batch": self.base.config.batch,
            "gpu_bytes_per_rank": self.rank_bytes("gpu"),
            "host_bytes_per_rank": self.rank_bytes("cpu"),
            "host_bytes_per_host": self.host_bytes("cpu"),
            "nvme_bytes_per_host": self.host_bytes("nvme"),
            "net_bytes_per_step": self.net_bytes_per_step(),
            "interconnect_bytes_per_s": self.base.machine.peer_bytes_per_s,
            "feasible": self.feasible,
            "overflows": [{"tier": t, "bytes_over": int(b)} for t, b in self.overflows()],
        }


def _ring_sent(op: Op, nproc: int) -> int:
    rounds = 2 if op.kind == K.ALL_REDUCE else 1
    return rounds * (nproc - 1) * op.work.bytes // nproc


def max_ranks(machine: Machine) -> int:
    return machine.gpus or DEFAULT_GPUS_PER_NODE


def check_nproc(machine: Machine, config: TrainConfig, nproc: int) -> None:
    """ValueError naming the problem: rank count out of range, batch not divisible, schedule."""
    most = max_ranks(machine)
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= most:
        has = (f"the machine has {most} GPUs" if machine.gpus
               else "one node's GPUs; the machine profile states no `gpus` count")  # fmt: skip
        raise ValueError(f"nproc must be a whole number from 1 to {most} ({has}), got {nproc!r}")
    if nproc > 1 and config.schedule != "sliding":
        raise ValueError(f"nproc {nproc}: data parallel needs the sliding schedule, "
                         f"not {str(config.schedule)!r}")  # fmt: skip
    if config.batch % nproc:
        raise ValueError(
            f"batch {config.batch} is the global batch, split over {nproc} ranks: it must be a "
            f"multiple of {nproc} (each rank takes batch / nproc)"
        )


def plan_data_parallel(
    model: ModelSpec, machine: Machine, config: TrainConfig, nproc: int, rank: int = 0
) -> DataParallelPlan:
    """Rank `rank` of `nproc` on one node, `config.batch` being the global (micro-)batch: one
    rank's plan at batch / nproc, sharded. Its placement is searched as the ranks will run it:
    each candidate sized and timed sharded (`plan(..., nproc=)`)."""
    check_nproc(machine, config, nproc)
    base = plan(model, machine, replace(config, batch=config.batch // nproc), nproc=nproc)
    return shard_plan(base, nproc, rank)


def shard_plan(base: Plan, nproc: int, rank: int = 0) -> DataParallelPlan:
    """`base` (one rank's single-GPU plan) as rank `rank` of `nproc`."""
    graph = shard_graph(base.graph, base.model, nproc, rank)
    sized = {p.name: p.bytes for p in graph.pools}
    terms = tuple(
        RankTerm(
            name=t.pool.name,
            label=t.label,
            tier=t.report_tier,
            bytes=sized[t.pool.name],
            single=t.bytes,
        )
        for t in base.ledger.terms
    )
    return DataParallelPlan(base=base, nproc=nproc, rank=rank, graph=graph, terms=terms)
