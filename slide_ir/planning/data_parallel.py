"""Data-parallel sliding on one node: rank r's schedule, derived from the single-GPU plan.

N ranks each slide their own window over the same layers on their own slice of the global
batch (batch / N). The single-GPU planner plans one rank at that batch (`plan_data_parallel`);
`shard_plan` then rewrites its graph into rank r's:

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

from collections.abc import Iterable
from dataclasses import dataclass, replace

from slide_ir.ir.graph import Graph, Op, OpKind, Pool, PoolRole, UnitPlacement, Value, Work
from slide_ir.planning.ledger import REPORT_TIERS, unit_params
from slide_ir.planning.planner import Plan, plan
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

K = OpKind
R = PoolRole
DEFAULT_GPUS_PER_NODE = 8  # a node's usual count, where the machine profile states none
# kinds whose work is a unit's parameters, each rank doing its shard's part of it
_PER_ELEMENT = frozenset({K.H2D_PARAM, K.D2H_GRAD, K.ADAM, K.GPU_ADAM, K.OPT_H2D, K.OPT_D2H,
                          K.W_D2H, K.CAST, K.GRAD_ACCUM})  # fmt: skip
_STATE_IO = frozenset({K.NVME_READ, K.NVME_WRITE})  # per element when they move a unit's state
# pools holding per-element state or its staging, split by element range
_SHARDED = frozenset({R.GRAD_LANDING, R.HOST_WEIGHTS, R.GRAD_ACCUM, R.MASTER, R.MOMENTS,
                      R.NVME_STATE, R.OPT_STAGING, R.STREAM_STATE})  # fmt: skip
_HANDBACK = "host_handback"  # GPU-kept state handed back to host RAM: each rank its shard


def shard_size(elements: int, nproc: int) -> int:
    """Elements of the largest shard (and of every padded part): ceil(elements / nproc)."""
    return -(-elements // nproc)


def shard_range(elements: int, nproc: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank `rank`'s shard of a unit of `elements`; the ranks' ranges tile
    [0, elements) in rank order (the last ones may be shorter, or empty, on tiny units)."""
    if not 0 <= rank < nproc:
        raise ValueError(f"rank must be within [0, {nproc}), got {rank}")
    c = shard_size(elements, nproc)
    return min(rank * c, elements), min((rank + 1) * c, elements)


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
        """(tier, bytes over): the GPU per rank, host RAM and NVMe per host."""
        use = {"gpu": self.rank_bytes("gpu"), "cpu": self.host_bytes("cpu"),
               "nvme": self.host_bytes("nvme")}  # fmt: skip
        over = [(t, use[t] - self.capacity_bytes(t)) for t in REPORT_TIERS]
        return [(t, b) for t, b in over if b > 0]

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
    """Rank `rank` of `nproc` on one node, `config.batch` being the global (micro-)batch: the
    single-GPU plan at batch / nproc, sharded. The placement is chosen for one GPU at that
    batch (conservative: it sees each rank's link and GPU update work whole)."""
    check_nproc(machine, config, nproc)
    base = plan(model, machine, replace(config, batch=config.batch // nproc))
    return shard_plan(base, nproc, rank)


def shard_plan(base: Plan, nproc: int, rank: int = 0) -> DataParallelPlan:
    """`base` (one rank's single-GPU plan) as rank `rank` of `nproc`."""
    model = base.model
    if nproc == 1:
        graph = base.graph
    else:
        ops = _rewrite(base.graph.ops, model, base.graph.info.placement, nproc, rank)
        pools = tuple(_shard_pool(p, model, nproc, rank) for p in base.graph.pools)
        graph = Graph(info=base.graph.info, pools=pools, ops=tuple(ops))
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


# -- the graph -----------------------------------------------------------------------------------
def _rewrite(
    ops: Iterable[Op], model: ModelSpec, placement: tuple[UnitPlacement, ...], nproc: int,
    rank: int,
) -> list[Op]:  # fmt: skip
    out: list[Op] = []
    then: dict[str, str] = {}  # op id -> the all-gather that completes what it wrote
    writer: dict[tuple[str, str], str] = {}  # value -> its latest writer so far
    collectives: set[str] = set()
    for op in ops:
        # whoever waited for an upload waits for its all-gather; whoever touches a value a
        # collective wrote last waits for that collective (gpu lane order no longer covers it)
        after = [writer[k] for v in op.reads + op.writes if (k := (v.name, v.slot)) in writer]
        deps = [then.get(d, d) for d in op.deps] + [w for w in after if w in collectives]
        op = replace(op, deps=tuple(dict.fromkeys(deps)))
        q = unit_params(model, op.unit)
        if op.kind in (K.D2H_GRAD, K.GPU_ADAM):
            g = next(v for v in op.reads if v.name == f"L{op.unit}.g")
            rs = _collective(op, K.REDUCE_SCATTER, "g.rs", g, writer[(g.name, g.slot)], q, nproc)
            out.append(rs)
            collectives.add(rs.id)
            writer[(g.name, g.slot)] = rs.id
            op = replace(op, deps=(*op.deps, rs.id))
        out.append(_sharded(op, q, nproc, rank))
        for v in op.writes:
            writer[(v.name, v.slot)] = op.id
        resident = op.kind == K.GPU_ADAM and placement[op.unit] == UnitPlacement.RESIDENT
        if op.kind == K.H2D_PARAM or resident:
            w = next(v for v in op.writes if v.name == f"L{op.unit}.w")
            what = "w.ag.bwd" if op.id.endswith(".bwd") else "w.ag"
            ag = _collective(op, K.ALL_GATHER, what, w, op.id, q, nproc)
            out.append(ag)
            collectives.add(ag.id)
            then[op.id] = ag.id
            writer[(w.name, w.slot)] = ag.id
    return out


def _collective(op: Op, kind: OpKind, what: str, value: Value, after: str, q: int,
                nproc: int) -> Op:  # fmt: skip
    """`kind` of `value` in place on `net`, after `after`; the message is N padded shards at
    the bytes per element of the transfer `op` moves (or its gradient's: 2 B)."""
    per_elem = op.work.bytes // q if op.kind in (K.H2D_PARAM, K.D2H_GRAD) else 2
    prefix = op.id[: op.id.index(f"L{op.unit}.")]
    return Op(
        id=f"{prefix}L{op.unit}.{what}",
        kind=kind,
        lane="net",
        step=op.step,
        unit=op.unit,
        micro=op.micro,
        work=Work(bytes=nproc * shard_size(q, nproc) * per_elem),
        deps=(after,),
        reads=(value,),
        writes=(value,),
    )


def _sharded(op: Op, q: int, nproc: int, rank: int) -> Op:
    state_io = op.kind in _STATE_IO and any(v.name.startswith("L") for v in op.reads + op.writes)
    if op.kind not in _PER_ELEMENT and not state_io:
        return op
    start, end = shard_range(q, nproc, rank)
    w = op.work
    return replace(op, work=Work(flops=w.flops, attn_flops=w.attn_flops,
                                 bytes=_part(w.bytes, end - start, q),
                                 elements=_part(w.elements, end - start, q)))  # fmt: skip


def _part(amount: int, shard: int, q: int) -> int:
    """`amount` for `shard` of `q` elements, rounded up."""
    return -(-amount * shard // q)


# -- the pools -----------------------------------------------------------------------------------
def _shard_pool(pool: Pool, model: ModelSpec, nproc: int, rank: int) -> Pool:
    q = max((unit_params(model, u) for u in pool.units), default=0)
    if pool.role == R.RESIDENT and q:
        return replace(pool, slot_bytes=_resident_slot(pool, q, nproc, rank))
    if pool.role == R.UNIT and q:  # whole units, padded to N equal parts for the collectives
        padded = max(nproc * shard_size(unit_params(model, u), nproc) for u in pool.units)
        return replace(pool, slot_bytes=pool.slot_bytes * padded // q)
    sharded = pool.role in _SHARDED or pool.name == _HANDBACK
    if not sharded:
        return pool
    if not q:  # no unit to measure by: an even split
        return replace(pool, slot_bytes=-(-pool.slot_bytes // nproc))
    start, end = shard_range(q, nproc, rank)
    return replace(pool, slot_bytes=_part(pool.slot_bytes, end - start, q))


def _resident_slot(pool: Pool, q: int, nproc: int, rank: int) -> int:
    """A resident slot keeps its BF16 weights and gradients whole (4 B/param, padded to N
    equal parts for the collectives) and its FP32 master and moments for the rank's shard."""
    start, end = shard_range(q, nproc, rank)
    return 4 * nproc * shard_size(q, nproc) + _part(pool.slot_bytes - 4 * q, end - start, q)
