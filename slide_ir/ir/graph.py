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

import functools
import itertools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from slide_ir.ir.dataflow import Order, check_dataflow, check_tenancy

FORMAT_VERSION = 2  # 2: ops name a `unit` (was `layer`), values, micro-batch; pools a role


class OpKind(StrEnum):
    """The closed op vocabulary. Every engine has a handler for each member.

    Operands (`Op.reads` -> `Op.writes`), in this order; `w`/`g` a unit's weights/gradient:
    FWD (w, x) -> (x'); the embedding's FWD (w) -> (x', tokens): it takes the micro-batch in;
    RECOMPUTE (w, x) -> (tape); BWD (w, tape, dx') -> (g, dx), the embedding's (w, tokens, dx')
    -> (g); LOSS (w, x, tokens[, tied embedding w]) -> (g, dx[, tied embedding g]);
    EVAL_LOSS (w, x, tokens[, tied embedding w]) -> (): the loss only, for an eval graph;
    GPU_ADAM (g, state) -> (w, state); OPT_H2D (master, moments) -> (state); OPT_D2H the
    reverse; GRAD_ACCUM (landed g) -> (accumulator); ADAM reads the landed g, the accumulator
    and the state (RAM or NVMe staging) and writes the state and the pinned w (a unit whose
    upload is cast from the master has none), told apart by their pools' roles; every other
    kind is a copy (src) -> (dst)."""

    FWD = "fwd"  # forward of one layer on the GPU
    RECOMPUTE = "recompute"  # forward again from the saved layer input, before its backward
    BWD = "bwd"  # backward of one layer
    LOSS = "loss"  # head stage: final norm + LM head + cross-entropy, forward and backward
    EVAL_LOSS = "eval_loss"  # the head stage's forward only: an eval batch's summed token loss
    H2D_PARAM = "h2d_param"  # upload a layer's BF16 weights into a GPU cache unit
    D2H_GRAD = "d2h_grad"  # download a layer's gradients into pinned CPU memory
    ADAM = "adam"  # CPU AdamW update of one layer (FP32 master + moments), BF16 cast fused
    GPU_ADAM = "gpu_adam"  # fused AdamW on the GPU for a resident or streamed layer
    OPT_H2D = "opt_h2d"  # upload a streamed layer's FP32 master + moments for its GPU AdamW
    OPT_D2H = "opt_d2h"  # download them back after the update
    W_D2H = "w_d2h"  # download a streamed layer's updated BF16 weights into the pinned copy
    # FP32 master -> compute-dtype weights on the CPU: ZeRO-offload's after its updates; the
    # sliding schedule's into a weight-staging slot right before the unit's upload
    CAST = "cast"
    GRAD_ACCUM = "grad_accum"  # add a micro-batch's landed BF16 grads into the CPU FP32 accumulator
    # global clipping: each parameter's gradient norm of a unit (where its step's gradient is
    # whole: the GPU for device-updated units, the landed copy on the host for the others)
    GRAD_NORM = "grad_norm"
    NORM = "norm"  # the step's global norm from every unit's: the clip scale and finiteness
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


class PoolRole(StrEnum):
    """What a pool's slots hold, so an engine knows how to allocate it without its name."""

    ACCOUNTING = "accounting"  # counted, never allocated by Slide: CUDA context, process, hand-back
    WORKSPACE = "workspace"  # compute scratch torch allocates; a recompute's tape lives there
    TAPE = "tape"  # autograd tapes a forward keeps for its backward; torch allocates them
    TOKENS = "tokens"  # the current micro-batch's token ids and labels on the GPU
    HIDDEN = "hidden"  # layer inputs (B x S x H) on the GPU
    HIDDEN_GRAD = "hidden_grad"  # gradients w.r.t. hidden states on the GPU
    HOST_HIDDEN = "host_hidden"  # saved layer inputs, or their NVMe staging, in pinned RAM
    NVME_HIDDEN = "nvme_hidden"  # saved layer inputs on NVMe
    UNIT = "unit"  # one unit's compute-dtype weights + grads on the GPU (a cache-ring slot)
    RESIDENT = "resident"  # units whole on the GPU: weights, grads, FP32 master and moments
    STREAM_STATE = "stream_state"  # a streamed unit's FP32 master, moments and grad on the GPU
    DEVICE_WEIGHTS = "device_weights"  # every unit's weights on the GPU, one flat slot
    DEVICE_GRADS = "device_grads"  # every unit's gradients on the GPU, one flat slot
    GRAD_LANDING = "grad_landing"  # pinned RAM that downloaded gradients land in
    HOST_WEIGHTS = "host_weights"  # the pinned compute-dtype copy an upload reads
    WEIGHT_STAGING = "weight_staging"  # a pinned ring an upload reads, cast from the master
    GRAD_ACCUM = "grad_accum"  # FP32 gradient accumulators in RAM
    MASTER = "master"  # FP32 master weights in RAM (pinned for streamed units)
    MOMENTS = "moments"  # Adam moments in RAM (pinned for streamed units)
    NVME_STATE = "nvme_state"  # optimizer state on NVMe, striped over the drives
    OPT_STAGING = "opt_staging"  # RAM staging of the NVMe optimizer-state stripes
    GRAD_NORMS = "grad_norms"  # a unit's per-parameter gradient norms (FP32, pinned)
    GRAD_SCALE = "grad_scale"  # the step's clip scale and global norm (FP32, pinned)


class Dtype(StrEnum):
    """What a pool's elements are, so an engine allocates them without guessing from byte
    counts: `compute` is the run's compute dtype (BF16 on a GPU; FP32 in the CPU mode),
    `moments` the Adam moments' (FP32 or BF16, `GraphInfo.moments_dtype`)."""

    NONE = ""  # not one element array: accounting, torch's workspaces, tokens, NVMe regions
    COMPUTE = "compute"
    FP32 = "fp32"
    MOMENTS = "moments"


class UnitPlacement(StrEnum):
    """Where a unit lives and who updates it (the graph's info lists one per unit)."""

    RESIDENT = "resident"  # whole on the GPU, updated there
    STREAMED = "streamed"  # slides; its state visits the GPU for a GPU AdamW
    SLIDING = "sliding"  # slides; host AdamW, state in RAM
    NVME = "nvme"  # slides (or stays, ZeRO-offload); host AdamW, state homed on NVMe
    OFFLOADED = "offloaded"  # ZeRO-offload: weights stay on the GPU, host AdamW, state in RAM


LANE_KINDS = ("gpu", "h2d", "d2h", "cpu", "nvme", "net")


@functools.cache  # a graph has a handful of lanes and thousands of ops
def lane_kind(lane: str) -> str:
    """The lane's kind: `nvme0`, `nvme1` are lanes of kind `nvme` (one per drive)."""
    base = lane.rstrip("0123456789")
    if base not in LANE_KINDS:
        raise ValueError(f"lane {lane!r}: kind must be one of {', '.join(LANE_KINDS)}")
    return base


def lane_index(lane: str) -> int:
    """The number of a lane of its kind: `nvme1` -> 1 (the drive), `gpu` -> 0."""
    kind = lane_kind(lane)
    return int(lane[len(kind) :] or 0)


class Role(StrEnum):
    """What an operand is to its op where the op's kind has optional operands: an interpreter
    tells the variants apart by these, never by a unit number or an operand count."""

    MAIN = "main"  # the operands every op of the kind has (the order its kind documents)
    TOKENS = "tokens"  # the step's token ids and labels: the embedding's fwd writes, its bwd reads
    TAPE = "tape"  # a layer's autograd tape, written by a forward that keeps it for its bwd
    TIED = "tied"  # the embedding's weights (read) and gradients (written) of a tied LM head


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
class Gemm:
    """A matmul (m x k) @ (k x n), run `count` times: a GEMM's rate depends on its shape (tile
    and wave quantisation, the K loop's prologue), so the cost model prices each one by it.
    Printed `MxNxK` or `MxNxK*count`."""

    m: int
    n: int
    k: int
    count: int = 1

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Gemm.{name} must be a whole number >= 1, got {value!r}")

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def bytes(self) -> int:
        """BF16 operands read and result written, once per run (the memory-bound limit)."""
        return 2 * (self.m * self.k + self.k * self.n + self.m * self.n) * self.count

    def __str__(self) -> str:
        shape = f"{self.m}x{self.n}x{self.k}"
        return shape if self.count == 1 else f"{shape}*{self.count}"

    @classmethod
    def parse(cls, text: str) -> Gemm:
        shape, _, count = text.partition("*")
        try:
            m, n, k = (int(x) for x in shape.split("x"))
            return cls(m=m, n=n, k=k, count=int(count or 1))
        except ValueError as error:
            raise ValueError(f"bad GEMM {text!r}: expected MxNxK or MxNxK*count") from error


@dataclass(frozen=True, kw_only=True, slots=True)
class Attention:
    """Fused causal attention over `batch` x `heads` sequences of `seq` tokens, `head_dim` wide
    (`window` > 0: a sliding window of that many keys): the shape its rate depends on (causal
    block quantisation, occupancy, head width). Printed `BxHxSxD` or `BxHxSxDwW`."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    window: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq", "head_dim", "window"):
            value = getattr(self, name)
            low = 0 if name == "window" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Attention.{name} must be a whole number >= {low}, got {value!r}")

    def __str__(self) -> str:
        shape = f"{self.batch}x{self.heads}x{self.seq}x{self.head_dim}"
        return shape + (f"w{self.window}" if self.window else "")

    @classmethod
    def parse(cls, text: str) -> Attention:
        shape, _, window = text.partition("w")
        try:
            b, h, s, d = (int(x) for x in shape.split("x"))
            return cls(batch=b, heads=h, seq=s, head_dim=d, window=int(window or 0))
        except ValueError as error:
            raise ValueError(f"bad attention shape {text!r}: expected BxHxSxD[wW]") from error


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """Physical work of an op, never seconds: the cost model turns it into time. `gemms` and
    `attention` give the shapes of the GPU work where the planner knows them (a decoder layer,
    the fused loss); `flops` stays the model-FLOPs total either way."""

    flops: float = 0.0
    attn_flops: float = 0.0  # the part of `flops` spent in attention (SDPA runs at its own rate)
    bytes: int = 0  # bytes moved (transfers), touched (optimizer) or streamed by GPU kernels
    elements: int = 0  # parameters updated or cast
    gemms: tuple[Gemm, ...] = ()  # the matmuls of `flops - attn_flops`, by shape
    attention: Attention | None = None  # the shape of `attn_flops`

    def __post_init__(self) -> None:
        if min(self.flops, self.attn_flops, self.bytes, self.elements) < 0:
            name = next(
                n for n in ("flops", "attn_flops", "bytes", "elements") if getattr(self, n) < 0
            )
            raise ValueError(f"Work.{name} must be >= 0, got {getattr(self, name)}")
        if self.attn_flops > self.flops:
            raise ValueError(f"Work.attn_flops ({self.attn_flops}) exceeds flops ({self.flops})")


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
                   "dtype": Dtype(d.get("dtype", Dtype.NONE))})  # fmt: skip


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
