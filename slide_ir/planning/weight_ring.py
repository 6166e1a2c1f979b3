"""Uploads cast on the fly: a unit's compute-dtype weights made from its FP32 master just
before the upload, in a small pinned ring, instead of a pinned copy of every unit.

A pinned copy of every host-updated unit costs 2 B/param of host RAM beside the 12 of master
and moments (145 GB for a 72B model); SlideFormer keeps none. Here a `CAST` on the `cpu` lane
reads the unit's master once its latest update is done (`Ctx.last_update`: the step's deferred
update under global clipping too) and writes the weights into a slot of `pinned_weight_ring`
(`transfer_terms.weight_ring_slots`, each the largest such unit); the unit's `H2D_PARAM`
waits for the cast, reads the slot and releases it. The next tenant's cast waits for that release
(`GraphBuilder` ring reuse), so at most that many casts run ahead of the uploads. Every upload
casts, the backward's re-uploads too: a cast is 6 B/param on the host (FP32 read, BF16 write)
against the 2 B the update's fused copy wrote. Which units cast is the ledger's choice
(`transfer_terms.cast_units`).

With the optimizer on NVMe (`--optimizer nvme`) the master is read from the drive for each cast
(the master part of each drive's stripe, 4 B/param into `master_staging`): 2 B/param less RAM
than the pinned copy for 4 B/param more drive reads per upload.

Invariant: a unit in `Ctx.cast` has no `HOST_WEIGHTS` home; its update writes only the state.
"""

from __future__ import annotations

from slide_ir.ir.graph import OpKind, PoolRole, Value, Work
from slide_ir.planning.emit_context import Ctx
from slide_ir.planning.units import BF16, FP32
from slide_ir.planning.values import unit_value, weights

RING_POOL = "pinned_weight_ring"
MASTER_POOL = "master_staging"


def cast_for_upload(ctx: Ctx, op_id: str, step: int, unit: int, after: str | None) -> str:
    """Emit `op_id`, the cast of `unit`'s master into a ring slot once `after` (its latest
    update) is done; returns the slot, which the upload that reads it releases."""
    p = ctx.params(unit)
    sources, deps, staged = _master(ctx, op_id, step, unit, after)
    (slot,) = ctx.b.emit(op_id, OpKind.CAST, "cpu", step=step, unit=unit,
                         work=Work(elements=p, bytes=p * (FP32 + BF16)), deps=deps,
                         acquire=[RING_POOL], reads=sources, release=staged,
                         writes=[ctx.taken(weights(unit))])  # fmt: skip
    return slot


def _master(
    ctx: Ctx, op_id: str, step: int, unit: int, after: str | None
) -> tuple[list[Value | None], list[str | None], list[str]]:
    """Where the cast reads the master: its home in RAM, or with the master on NVMe one read
    per drive of the master part of the unit's stripe (`nvme`'s stripe layout: [master | m | v])
    into `master_staging`, each after the unit's latest update (its write-back precedes the
    read on the drive's lane). Returns the cast's reads, its deps and the slots it releases."""
    if (PoolRole.MASTER, unit) in ctx.homes or (PoolRole.NVME_STATE, unit) not in ctx.homes:
        return [ctx.home(PoolRole.MASTER, unit, "master")], [after], []
    share = -(-ctx.params(unit) // ctx.drives) * FP32
    sources: list[Value | None] = []
    reads: list[str | None] = []
    slots: list[str] = []
    for k in range(ctx.drives):
        read = f"{op_id}.read{k}"
        (slot,) = ctx.b.emit(read, OpKind.NVME_READ, f"nvme{k}", step=step, unit=unit,
                             work=Work(bytes=share), deps=[after], acquire=[MASTER_POOL],
                             reads=[ctx.home(PoolRole.NVME_STATE, unit, f"state{k}")],
                             writes=[ctx.taken(unit_value(unit, f"master{k}"))])  # fmt: skip
        sources.append(ctx.at(unit_value(unit, f"master{k}"), slot))
        reads.append(read)
        slots.append(slot)
    return sources, reads, slots
