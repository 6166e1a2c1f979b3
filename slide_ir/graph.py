"""The schedule IR: lanes, ops, pools. Pure data that both engines (simulator, executor) run.

A `Graph` is one ordered tuple of ops plus the pools of pre-allocated memory they use.

Invariants (checked by `Graph.__post_init__`, errors name the offending op):
- op ids are unique; every dependency names an op that comes *earlier* in the tuple;
- each lane runs its ops one at a time, in tuple order (like a CUDA stream), so with every
  dependency earlier in the list no valid graph can deadlock;
- every acquired slot exists and is released by the same op or a later one; a slot is held by one
  tenant at a time, and the next tenant's acquiring op depends (transitively) on the previous
  tenant's releasing op: reuse is an ordinary dependency both engines obey.

Memory of a tier at any instant = bytes of its static pools + bytes of the slots held at that
instant. A slot is held from the start of the op that acquires it to the end of the op that
releases it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

FORMAT_VERSION = 2  # 2: ops name a `unit` (was `layer`), values, micro-batch; pools a role


class OpKind(StrEnum):
    """The closed op vocabulary. Every engine has a handler for each member."""

    FWD = "fwd"  # forward of one layer on the GPU
    RECOMPUTE = "recompute"  # forward again from the saved layer input, before its backward
    BWD = "bwd"  # backward of one layer
    LOSS = "loss"  # head stage: final norm + LM head + cross-entropy, forward and backward
    H2D_PARAM = "h2d_param"  # upload a layer's BF16 weights into a GPU cache unit
    D2H_GRAD = "d2h_grad"  # download a layer's gradients into pinned CPU memory
    ADAM = "adam"  # CPU AdamW update of one layer (FP32 master + moments), BF16 cast fused
    GPU_ADAM = "gpu_adam"  # fused AdamW on the GPU for a resident or streamed layer
    OPT_H2D = "opt_h2d"  # upload a streamed layer's FP32 master + moments for its GPU AdamW
    OPT_D2H = "opt_d2h"  # download them back after the update
    W_D2H = "w_d2h"  # download a streamed layer's updated BF16 weights into the pinned copy
    CAST = "cast"  # FP32 -> BF16 cast of updated weights on the CPU, when not fused into adam
    GRAD_ACCUM = "grad_accum"  # add a micro-batch's landed BF16 grads into the CPU FP32 accumulator
    ACT_SAVE = "act_save"  # copy a layer's input activation GPU -> CPU (d2h lane)
    ACT_LOAD = "act_load"  # copy it back CPU -> GPU ahead of the layer's recompute (h2d lane)
    NVME_READ = "nvme_read"  # read optimizer state or activations from NVMe
    NVME_WRITE = "nvme_write"  # write them back
    # Collectives on a `net` lane (multi-GPU layouts; work.bytes = the full logical message):
    ALL_REDUCE = "all_reduce"  # sum a tensor across a group (TP blocks, unsharded DP grads)
    REDUCE_SCATTER = "reduce_scatter"  # sum and leave each rank its shard (sharded DP grads)
    ALL_GATHER = "all_gather"  # every rank gets every shard (weights after a sharded update)
    ALL_TO_ALL = "all_to_all"  # each rank sends a slice to every other (EP dispatch/combine)
    SEND_RECV = "send_recv"  # point to point (PP activations/grads, the CP key/value ring)


class Tier(StrEnum):
    """Where bytes live. `cpu` is pageable host RAM; `pinned` is page-locked host RAM."""

    GPU = "gpu"
    PINNED = "pinned"
    CPU = "cpu"
    NVME = "nvme"


LANE_KINDS = ("gpu", "h2d", "d2h", "cpu", "nvme", "net")


def lane_kind(lane: str) -> str:
    """The lane's kind: `nvme0`, `nvme1` are lanes of kind `nvme` (one per drive)."""
    base = lane.rstrip("0123456789")
    if base not in LANE_KINDS:
        raise ValueError(f"lane {lane!r}: kind must be one of {', '.join(LANE_KINDS)}")
    return base


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """Physical work of an op, never seconds: the cost model turns it into time."""

    flops: float = 0.0
    attn_flops: float = 0.0  # the part of `flops` spent in attention (SDPA runs at its own rate)
    bytes: int = 0  # bytes moved (transfers), touched (optimizer) or streamed by GPU kernels
    elements: int = 0  # parameters updated or cast

    def __post_init__(self) -> None:
        for name in ("flops", "attn_flops", "bytes", "elements"):
            if getattr(self, name) < 0:
                raise ValueError(f"Work.{name} must be >= 0, got {getattr(self, name)}")
        if self.attn_flops > self.flops:
            raise ValueError(f"Work.attn_flops ({self.attn_flops}) exceeds flops ({self.flops})")


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One unit of work on one lane. `unit`: 0 embedding, 1..n decoder layers, n+1 head."""

    id: str
    kind: OpKind
    lane: str
    step: int
    unit: int
    work: Work = field(default_factory=Work)
    deps: tuple[str, ...] = ()
    acquires: tuple[str, ...] = ()
    releases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.id or any(c.isspace() for c in self.id):
            raise ValueError(f"op id {self.id!r} must be non-empty and contain no whitespace")
        lane_kind(self.lane)


@dataclass(frozen=True, kw_only=True, slots=True)
class Pool:
    """Pre-allocated memory on one tier, made of equal slots. Static pools are held all run."""

    name: str
    tier: Tier
    slots: int
    slot_bytes: int
    static: bool = False

    def __post_init__(self) -> None:
        if self.slots <= 0:
            raise ValueError(f"pool {self.name!r}: slots must be > 0, got {self.slots}")
        if self.slot_bytes < 0:
            raise ValueError(f"pool {self.name!r}: slot_bytes must be >= 0, got {self.slot_bytes}")

    @property
    def bytes(self) -> int:
        return self.slots * self.slot_bytes

    def slot_ids(self) -> tuple[str, ...]:
        return tuple(slot_id(self.name, i) for i in range(self.slots))


def slot_id(pool: str, index: int) -> str:
    return f"{pool}.{index}"


def slot_pool(slot: str) -> str:
    return slot.rpartition(".")[0]


@dataclass(frozen=True, kw_only=True, slots=True)
class GraphInfo:
    """What the graph was planned for: enough to compute throughput from a trace."""

    schedule: str
    model: str
    machine: str
    batch: int
    seq: int
    steps: int
    grad_accum: int = 1
    num_layers: int
    params: int
    flops_per_step: float  # model FLOPs of one step (6N-style, with attention; no recompute)

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq * self.grad_accum


class GraphError(ValueError):
    """An invalid graph; the message names the offending op."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Graph:
    info: GraphInfo
    pools: tuple[Pool, ...]
    ops: tuple[Op, ...]

    def __post_init__(self) -> None:
        _validate(self)

    # -- views ---------------------------------------------------------------------------------
    def lanes(self) -> tuple[str, ...]:
        """Lanes in order of first use."""
        return tuple(dict.fromkeys(op.lane for op in self.ops))

    def lane_ops(self, lane: str) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.lane == lane)

    def op(self, op_id: str) -> Op:
        for op in self.ops:
            if op.id == op_id:
                return op
        raise KeyError(op_id)

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def slot_bytes(self) -> dict[str, int]:
        return {s: p.slot_bytes for p in self.pools for s in p.slot_ids()}

    def tier_bytes(self) -> dict[Tier, int]:
        """Bytes reserved per tier: the sum of its pools (what an engine allocates up front)."""
        out = dict.fromkeys(Tier, 0)
        for pool in self.pools:
            out[pool.tier] += pool.bytes
        return out

    def static_bytes(self) -> dict[Tier, int]:
        out = dict.fromkeys(Tier, 0)
        for pool in self.pools:
            if pool.static:
                out[pool.tier] += pool.bytes
        return out

    def ops_per_lane(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.lane] = out.get(op.lane, 0) + 1
        return out

    def to_networkx(self):  # type: ignore[no-untyped-def]
        """A DiGraph view (dependency and lane-order edges) for analysis and plots."""
        import networkx as nx  # optional: only this view needs it

        g = nx.DiGraph()
        for op in self.ops:
            g.add_node(op.id, kind=str(op.kind), lane=op.lane, step=op.step, unit=op.unit)
            g.add_edges_from((d, op.id) for d in op.deps)
        for lane in self.lanes():
            ids = [op.id for op in self.lane_ops(lane)]
            g.add_edges_from(itertools.pairwise(ids), lane_order=True)
        return g

    # -- serial forms --------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {"version": FORMAT_VERSION, **asdict(self)}, separators=(",", ":"), sort_keys=False
        )

    @classmethod
    def from_json(cls, text: str) -> Graph:
        data = load_versioned(text, FORMAT_VERSION, "graph", GraphError)
        return cls(
            info=GraphInfo(**data["info"]),
            pools=tuple(Pool(**{**p, "tier": Tier(p["tier"])}) for p in data["pools"]),
            ops=tuple(_op_from_dict(o) for o in data["ops"]),
        )


def load_versioned(
    text: str, version: int, what: str, error: type[ValueError] = ValueError
) -> dict[str, Any]:
    """Parse a saved JSON document (graph, plan, trace) and refuse a format this code cannot read."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != version:
        found = data.get("version") if isinstance(data, dict) else None
        raise error(f"{what} format version {found!r} unsupported (this Slide reads {version})")
    return data


def _op_from_dict(d: Mapping[str, object]) -> Op:
    return Op(
        id=str(d["id"]),
        kind=OpKind(str(d["kind"])),
        lane=str(d["lane"]),
        step=int(d["step"]),  # type: ignore[call-overload]
        unit=int(d["unit"]),  # type: ignore[call-overload]
        work=Work(**d["work"]),  # type: ignore[arg-type]
        deps=tuple(d["deps"]),  # type: ignore[arg-type]
        acquires=tuple(d["acquires"]),  # type: ignore[arg-type]
        releases=tuple(d["releases"]),  # type: ignore[arg-type]
    )


# -- validation --------------------------------------------------------------------------------
def _validate(graph: Graph) -> None:
    names = [p.name for p in graph.pools]
    if len(set(names)) != len(names):
        raise GraphError(
            f"duplicate pool names: {sorted({n for n in names if names.count(n) > 1})}"
        )
    slots = graph.slot_bytes()
    static = {s for p in graph.pools if p.static for s in p.slot_ids()}
    position: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        if op.id in position:
            raise GraphError(f"op {op.id}: duplicate id")
        for dep in op.deps:
            if dep not in position:
                raise GraphError(f"op {op.id}: dependency {dep!r} is not an earlier op")
        for s in op.acquires + op.releases:
            if s not in slots:
                raise GraphError(f"op {op.id}: unknown slot {s!r}")
            if s in static:
                raise GraphError(f"op {op.id}: slot {s!r} belongs to a static pool")
        position[op.id] = i
    _check_slot_tenancy(graph, position)


def _check_slot_tenancy(graph: Graph, position: Mapping[str, int]) -> None:
    """One tenant per slot at a time; the next acquirer must depend on the last releaser."""
    holder: dict[str, str] = {}  # slot -> acquiring op id, while held
    last_release: dict[str, str] = {}  # slot -> op id that released it last
    preds = _predecessors(graph)
    for op in graph.ops:
        for s in op.acquires:
            if s in holder:
                raise GraphError(f"op {op.id}: acquires {s!r} still held by {holder[s]}")
            prev = last_release.get(s)
            if prev is not None and prev != op.id and not _reaches(prev, op.id, preds, position):
                raise GraphError(
                    f"op {op.id}: reuses slot {s!r} without depending on its release by {prev}"
                )
            holder[s] = op.id
        for s in op.releases:
            if holder.pop(s, None) is None:
                raise GraphError(f"op {op.id}: releases {s!r} which is not held")
            last_release[s] = op.id
    if holder:
        s, acq = next(iter(holder.items()))
        raise GraphError(f"op {acq}: acquires {s!r} which no later op releases")


def _predecessors(graph: Graph) -> dict[str, tuple[str, ...]]:
    """Dependency edges plus lane-order edges (an op also waits for its lane predecessor)."""
    preds: dict[str, tuple[str, ...]] = {}
    last_on_lane: dict[str, str] = {}
    for op in graph.ops:
        lane_prev = last_on_lane.get(op.lane)
        preds[op.id] = op.deps + ((lane_prev,) if lane_prev else ())
        last_on_lane[op.lane] = op.id
    return preds


def _reaches(
    src: str, dst: str, preds: Mapping[str, tuple[str, ...]], position: Mapping[str, int]
) -> bool:
    """Whether `dst` transitively waits for `src`. Every edge points forward in the op list,
    so ops listed before `src` cannot lie on a path from it and the search skips them."""
    floor = position[src]
    seen: set[str] = set()
    stack = [dst]
    while stack:
        cur = stack.pop()
        for p in preds[cur]:
            if p == src:
                return True
            if p not in seen and position[p] > floor:
                seen.add(p)
                stack.append(p)
    return False


def ops_by_id(ops: Iterable[Op]) -> dict[str, Op]:
    return {op.id: op for op in ops}
