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

The op vocabulary and the other enums are `slide_ir.ir.vocab`'s and an op's work is
`slide_ir.ir.work`'s; this module re-exports the names its callers import from here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from slide_ir.ir.dataflow import Order, check_dataflow, check_tenancy
from slide_ir.ir.vocab import Dtype as Dtype
from slide_ir.ir.vocab import OpKind as OpKind
from slide_ir.ir.vocab import PoolRole as PoolRole
from slide_ir.ir.vocab import Role as Role
from slide_ir.ir.vocab import Tier as Tier
from slide_ir.ir.vocab import UnitPlacement as UnitPlacement
from slide_ir.ir.vocab import lane_kind as lane_kind
from slide_ir.ir.work import Attention as Attention
from slide_ir.ir.work import Gemm as Gemm
from slide_ir.ir.work import Work as Work

# the fields of a micro-batch's tokens, in a token pool's slot (packed documents add positions)
TOKEN_FIELDS = ("input_ids", "labels", "positions")
# steps the driver stages micro-batches ahead of the step it waits for (`GraphInfo.feed_ahead`)
FEED_AHEAD = 1

FORMAT_VERSION = 2  # 2: ops name a `unit` (was `layer`), values, micro-batch; pools a role


@dataclass(frozen=True, kw_only=True, slots=True)
class Value:
    """A named value an op reads or writes, and the slot it sits in: `L12.w@gpu_units.1`.

    A slot may hold several values side by side (a unit's weights and gradients, a flat pool's
    per-unit regions, NVMe stripes); a value is (name, slot). `accumulate`: a write adds into
    the value (`+=`) instead of overwriting it."""

    name: str
    slot: str
    accumulate: bool = False
    role: Role = Role.MAIN

    def __str__(self) -> str:
        role = f"#{self.role}" if self.role != Role.MAIN else ""
        return f"{self.name}@{self.slot}{'+=' if self.accumulate else ''}{role}"

    @classmethod
    def parse(cls, text: str) -> Value:
        """The inverse of `str`: `name@slot`, `name@slot+=`, either with `#role`."""
        text, _, role = text.partition("#")
        accumulate = text.endswith("+=")
        name, at, slot = text.removesuffix("+=").partition("@")
        if not at or not name or not slot or "@" in slot:
            raise ValueError(f"value {text!r}: expected name@slot")
        if role and role not in set(Role):
            raise ValueError(f"value {text!r}: unknown role {role!r} (one of {', '.join(Role)})")
        return cls(name=name, slot=slot, accumulate=accumulate, role=Role(role or Role.MAIN))


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One unit of work on one lane. `unit`: 0 embedding, 1..n decoder layers, n+1 head.
    `micro`: the micro-batch of the step it belongs to (the last one for once-a-step ops).
    `reads` / `writes`: its operands, in the order its kind documents (see `OpKind`)."""

    id: str
    kind: OpKind
    lane: str
    step: int
    unit: int
    micro: int = 0
    work: Work = field(default_factory=Work)
    deps: tuple[str, ...] = ()
    acquires: tuple[str, ...] = ()
    releases: tuple[str, ...] = ()
    reads: tuple[Value, ...] = ()
    writes: tuple[Value, ...] = ()

    def read_as(self, role: Role) -> Value | None:
        """The operand the op reads in `role`, if it has one."""
        return next((v for v in self.reads if v.role == role), None)

    def written_as(self, role: Role) -> Value | None:
        """The operand the op writes in `role`, if it has one."""
        return next((v for v in self.writes if v.role == role), None)

    def __post_init__(self) -> None:
        if self.id.split() != [self.id]:
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
    role: PoolRole = PoolRole.ACCOUNTING
    # the units whose values the slots hold: slot i holds units[i] in a per-unit pool (as many
    # units as slots); a ring's or flat slot's candidates otherwise (sizes: the largest)
    units: tuple[int, ...] = ()
    # a slot holding several units side by side: the element at which each unit's region starts
    # (parallel to `units`; regions of units never held at once may overlap); empty: packed
    offsets: tuple[int, ...] = ()
    dtype: Dtype = Dtype.NONE
    # one slot's array where a slot is one (hidden states (B, S, H), a micro-batch's token
    # fields (fields, B, S), a step's loss (1,)): an engine allocates it as given; empty: a
    # slot sized by its units or its bytes
    shape: tuple[int, ...] = ()

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
    placement: tuple[UnitPlacement, ...] = ()  # per unit 0..n+1 (empty: not a single-GPU plan)
    lce_chunk: int = 0  # tokens per chunk of the fused loss (0: the whole micro-batch at once)
    optimizer: str = "cpu"  # where host-updated units' state lives: cpu | nvme | nvme-moments
    moments_dtype: str = "fp32"  # of the Adam moments: fp32 | bf16
    clip_norm: float = (
        0.0  # per-unit gradient clipping's max norm, right before each update (0: none)
    )
    global_clip_norm: float = 0.0  # global clipping's max norm, updates after it (0: none)
    # steps the driver may stage ahead of the step it waits for: the host token pool holds
    # feed_ahead + 1 steps' micro-batches, and a step's embedding waits for the step that many
    # before it to end (the graph's edges say so, for the simulator too)
    feed_ahead: int = FEED_AHEAD

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

    @classmethod
    def unchecked(cls, *, info: GraphInfo, pools: tuple[Pool, ...], ops: tuple[Op, ...]) -> Graph:
        """A graph without the construction checks (O(ops), a fifth of building one): for the
        placement search's candidates, which are only timed. A plan's own graph is checked."""
        graph = object.__new__(cls)
        for name, value in (("info", info), ("pools", pools), ("ops", ops)):
            object.__setattr__(graph, name, value)
        return graph

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
            g.add_node(
                op.id, kind=str(op.kind), lane=op.lane, step=op.step, unit=op.unit, micro=op.micro
            )
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
            info=info_from_dict(data["info"]),
            pools=tuple(_pool_from_dict(p) for p in data["pools"]),
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


def info_from_dict(d: Mapping[str, Any]) -> GraphInfo:
    placement = tuple(map(UnitPlacement, d.get("placement", ())))
    return GraphInfo(**{**d, "placement": placement})


def _pool_from_dict(d: Mapping[str, Any]) -> Pool:
    return Pool(**{**d, "tier": Tier(d["tier"]), "role": PoolRole(d["role"]),
                   "units": tuple(d["units"]), "offsets": tuple(d["offsets"]),
                   "dtype": Dtype(d.get("dtype", Dtype.NONE)),
                   "shape": tuple(d.get("shape", ()))})  # fmt: skip


def work_from_dict(d: Mapping[str, Any]) -> Work:
    attention = d.get("attention")
    return Work(**{**d, "gemms": tuple(Gemm(**g) for g in d.get("gemms", ())),
                   "attention": None if attention is None else Attention(**attention)})  # fmt: skip


def _op_from_dict(d: Mapping[str, Any]) -> Op:
    return Op(
        id=str(d["id"]),
        kind=OpKind(str(d["kind"])),
        lane=str(d["lane"]),
        step=int(d["step"]),
        unit=int(d["unit"]),
        micro=int(d["micro"]),
        work=work_from_dict(d["work"]),
        deps=tuple(d["deps"]),
        acquires=tuple(d["acquires"]),
        releases=tuple(d["releases"]),
        reads=tuple(_value_from_dict(v) for v in d["reads"]),
        writes=tuple(_value_from_dict(v) for v in d["writes"]),
    )


def _value_from_dict(d: Mapping[str, Any]) -> Value:
    return Value(**{**d, "role": Role(d.get("role", Role.MAIN))})


# -- validation --------------------------------------------------------------------------------
def _validate(graph: Graph) -> None:
    names = [p.name for p in graph.pools]
    if len(set(names)) != len(names):
        raise GraphError(
            f"duplicate pool names: {sorted({n for n in names if names.count(n) > 1})}"
        )
    slots = graph.slot_bytes()
    static = {s for p in graph.pools if p.static for s in p.slot_ids()}
    seen: set[str] = set()
    for op in graph.ops:
        if op.id in seen:
            raise GraphError(f"op {op.id}: duplicate id")
        for dep in op.deps:
            if dep not in seen:
                raise GraphError(f"op {op.id}: dependency {dep!r} is not an earlier op")
        for s in op.acquires + op.releases:
            if s not in slots:
                raise GraphError(f"op {op.id}: unknown slot {s!r}")
            if s in static:
                raise GraphError(f"op {op.id}: slot {s!r} belongs to a static pool")
        seen.add(op.id)
    order = Order(graph.ops)
    problem = check_tenancy(graph.ops, order) or check_dataflow(graph.ops, order, slots, static)
    if problem is not None:
        raise GraphError(problem)
