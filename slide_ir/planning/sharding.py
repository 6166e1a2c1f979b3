"""Sharding a single-GPU graph for data-parallel rank r of N: the element ranges each rank
owns, the collectives on the `net` lane, the resized pools, and what one rank then holds.

Pure graph transforms (no planning): `data_parallel` shards a finished plan with them, and the
placement search times and sizes its candidates as ranks will run them (`shard_graph`,
`rank_bytes`, `rank_overflows`). What the rewrite does is told in `data_parallel`'s docstring.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from slide_ir.ir.graph import Graph, Op, OpKind, Pool, PoolRole, UnitPlacement, Value, Work
from slide_ir.ir.shards import shard_range, shard_size
from slide_ir.planning.ledger import REPORT_TIERS, Ledger
from slide_ir.planning.units import unit_params
from slide_ir.specs.model import ModelSpec

K = OpKind
R = PoolRole
# kinds whose work is a unit's parameters, each rank doing its shard's part of it
_PER_ELEMENT = frozenset({K.H2D_PARAM, K.D2H_GRAD, K.ADAM, K.GPU_ADAM, K.OPT_H2D, K.OPT_D2H,
                          K.W_D2H, K.CAST, K.GRAD_ACCUM, K.GRAD_NORM, K.REDO})  # fmt: skip
_STATE_IO = frozenset({K.NVME_READ, K.NVME_WRITE})  # per element when they move a unit's state
# pools holding per-element state or its staging, split by element range
_SHARDED = frozenset({R.GRAD_LANDING, R.HOST_WEIGHTS, R.GRAD_ACCUM, R.MASTER, R.MOMENTS,
                      R.NVME_STATE, R.OPT_STAGING, R.STREAM_STATE, R.ROLLBACK,
                      R.MASTER_STAGING})  # fmt: skip
_HANDBACK = "host_handback"  # GPU-kept state handed back to host RAM: each rank its shard


def shard_graph(
    graph: Graph, model: ModelSpec, nproc: int, rank: int, *, check: bool = True
) -> Graph:
    """`graph` (one rank's single-GPU graph) as rank `rank` of `nproc` runs it (`check=False`:
    without the graph's construction checks, for the placement search's candidates)."""
    if nproc == 1:
        return graph
    ops = tuple(_rewrite(graph.ops, model, graph.info.placement, nproc, rank))
    pools = shard_pools(graph.pools, model, nproc, rank)
    make = Graph if check else Graph.unchecked
    return make(info=graph.info, pools=pools, ops=ops)


def shard_pools(pools: Iterable[Pool], model: ModelSpec, nproc: int, rank: int) -> tuple[Pool, ...]:
    return tuple(_shard_pool(p, model, nproc, rank) for p in pools)


def rank_bytes(ledger: Ledger, model: ModelSpec, nproc: int, rank: int = 0) -> dict[str, int]:
    """Bytes rank `rank` holds per report tier (gpu; cpu, pinned included; nvme): the ledger's
    terms with their pools sharded. Rank 0 holds the largest shards."""
    out = dict.fromkeys(REPORT_TIERS, 0)
    for term in ledger.terms:
        out[term.report_tier] += _shard_pool(term.pool, model, nproc, rank).bytes
    return out


def rank_overflows(ledger: Ledger, model: ModelSpec, nproc: int) -> list[tuple[str, int]]:
    """(tier, bytes over) of N ranks on one node: each rank's GPU; host RAM and NVMe shared by
    the N ranks (rank 0's share N times: an upper bound)."""
    held = rank_bytes(ledger, model, nproc)
    use = {"gpu": held["gpu"], "cpu": nproc * held["cpu"], "nvme": nproc * held["nvme"]}
    over = [(t, use[t] - ledger.capacity_bytes(t)) for t in REPORT_TIERS]
    return [(t, b) for t, b in over if b > 0]


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
        g = _unreduced_gradient(op, writer, collectives)
        if g is not None:
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


def _unreduced_gradient(
    op: Op, writer: dict[tuple[str, str], str], collectives: set[str]
) -> Value | None:
    """The GPU gradient `op` is the first to take after the backward (its download, its
    device update, global clipping's norm of it), which the ranks must sum first."""
    first_takers = op.kind in (K.D2H_GRAD, K.GPU_ADAM) or (
        op.kind == K.GRAD_NORM and op.lane == "gpu"
    )
    if not first_takers:
        return None
    g = next(v for v in op.reads if v.name == f"L{op.unit}.g")
    return None if writer.get((g.name, g.slot)) in collectives else g


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
    return replace(op, work=replace(w, bytes=_part(w.bytes, end - start, q),
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
