"""The update ops every schedule shares: the GPU AdamW of a unit kept on the GPU, the host AdamW
(`OptimizerIo`, with its state read ahead from NVMe and written back when it lives there), and
the work each update's op is priced by.
"""

from __future__ import annotations

from slide_ir.ir.drives import grad_drive
from slide_ir.ir.graph import OpKind, PoolRole, Value, Work
from slide_ir.planning import values
from slide_ir.planning.emit_context import Ctx
from slide_ir.planning.transfer_terms import landing_pool
from slide_ir.planning.units import BF16, FP32, adam_bytes_per_param
from slide_ir.planning.values import grads, unit_value, weights

K = OpKind
R = PoolRole


def device_update(
    ctx: Ctx, step: int, unit: int, deps: list[str] | None = None, scale: Value | None = None
) -> str:
    """The GPU AdamW of a unit whose weights, grads and state live on the GPU; its op id.
    Under global clipping it waits for the step's norm (`deps`) and reads its `scale`."""
    op_id, slot = ctx.sid(step, unit, "gpu_adam"), ctx.on_gpu(unit)
    state = ctx.home(R.RESIDENT, unit, "state")
    ctx.b.emit(op_id, K.GPU_ADAM, "gpu", step=step, unit=unit, work=gpu_adam_work(ctx, unit),
               deps=deps or [], reads=[ctx.at(grads(unit), slot), state, scale],
               writes=[ctx.at(weights(unit), slot), state])  # fmt: skip
    return op_id


def adam_work(ctx: Ctx, unit: int, *, saved: int = 0) -> Work:
    """The host AdamW's pass over a unit, writing `saved` more bytes per parameter on the way
    (a speculative update's rollback copy)."""
    p = ctx.params(unit)
    nbytes = adam_bytes_per_param(ctx.config, weight_copy=unit not in ctx.cast) + saved
    return Work(elements=p, bytes=p * nbytes)


def gpu_adam_work(ctx: Ctx, unit: int) -> Work:
    """The GPU AdamW of a resident or streamed unit as the executor runs it: one pass, the host
    update's bytes (the gradient, master and moments, the weights written from the new master)."""
    p = ctx.params(unit)
    return Work(elements=p, bytes=p * adam_bytes_per_param(ctx.config))


def grad_accum_work(ctx: Ctx, unit: int) -> Work:
    """Read the landed BF16 grads, read-modify-write the FP32 accumulator."""
    p = ctx.params(unit)
    return Work(elements=p, bytes=p * (BF16 + 2 * FP32))


class OptimizerIo:
    """Optimizer state on NVMe: read a unit's state ahead of its update (striped over every
    drive), write it back after. `prefetch(order, q)` reads units order[q] and order[q + 1].
    Global clipping's gradients held on NVMe (`spill`) are read back with the state, into a
    landing slot the update frees."""

    def __init__(self, ctx: Ctx, step: int) -> None:
        self.ctx, self.step = ctx, step
        self.reads: dict[int, list[str]] = {}
        self.staging: dict[int, tuple[str, ...]] = {}
        self.spilled: dict[int, str] = {}  # unit -> the write of its held gradient
        self.loaded: dict[int, str] = {}  # unit -> the landing slot its gradient is read into
        self.on_nvme = {
            "cpu": 0,
            "nvme": FP32 + ctx.config.moment_bytes,
            "nvme-moments": ctx.config.moment_bytes,
        }[ctx.config.optimizer]
        # unit -> the staging pool its stripes are read into
        self.staging_pool = {u: pool.name for pool in ctx.b.pools if pool.role == R.OPT_STAGING
                             for u in pool.units}  # fmt: skip

    def prefetch(self, order: list[int], q: int) -> list[str]:
        """Emit the reads of order[q] (if not yet) and order[q + 1] (not with `lean_buffers`:
        its staging slot is order[q]'s); returns order[q]'s reads."""
        if not self.on_nvme and not self.ctx.config.spills_grads:
            return []
        for u in order[q : q + (1 if self.ctx.config.lean_buffers else 2)]:
            if u not in self.reads:
                self._read(u)
        return self.reads[order[q]]

    def _read(self, unit: int) -> None:
        ctx, d = self.ctx, self.ctx.drives
        share = -(-ctx.params(unit) * self.on_nvme // d)
        ids, slots = [], []
        for k in range(d if self.on_nvme else 0):  # only held gradients: no state to read
            op_id = ctx.sid(self.step, unit, f"opt.read{k}")
            (slot,) = ctx.b.emit(
                op_id,
                K.NVME_READ,
                f"nvme{k}",
                step=self.step,
                unit=unit,
                work=Work(bytes=share),
                deps=[ctx.last_update.get(unit)],
                acquire=[self.staging_pool[unit]],
                reads=[ctx.home(R.NVME_STATE, unit, f"state{k}")],
                writes=[ctx.taken(unit_value(unit, f"state{k}"))],
            )
            ids.append(op_id)
            slots.append(slot)
        if unit in self.spilled:
            ids.append(self._load(unit))
        self.reads[unit], self.staging[unit] = ids, tuple(slots)

    def spill(self, unit: int, landed: Value | None, landed_at: str, landing: str) -> None:
        """Write `unit`'s landed gradient to its drive, freeing the landing slot: global
        clipping holds it there, not in RAM, until the norm (`TrainConfig.spills_grads`)."""
        ctx = self.ctx
        op_id = ctx.sid(self.step, unit, "g.spill")
        ctx.b.emit(op_id, K.NVME_WRITE, f"nvme{grad_drive(unit, ctx.drives)}", step=self.step,
                   unit=unit, work=Work(bytes=ctx.params(unit) * BF16), deps=[landed_at],
                   release=[landing], reads=[landed],
                   writes=[ctx.home(R.NVME_GRADS, unit, "g")])  # fmt: skip
        self.spilled[unit] = op_id

    def _load(self, unit: int) -> str:
        """Read a held gradient back into a landing slot for its update; returns the read."""
        ctx = self.ctx
        op_id = ctx.sid(self.step, unit, "g.load")
        (slot,) = ctx.b.emit(op_id, K.NVME_READ, f"nvme{grad_drive(unit, ctx.drives)}",
                             step=self.step, unit=unit, work=Work(bytes=ctx.params(unit) * BF16),
                             deps=[self.spilled.pop(unit)],
                             acquire=[landing_pool(ctx.b.pools, unit)],
                             reads=[ctx.home(R.NVME_GRADS, unit, "g")],
                             writes=[ctx.taken(grads(unit))])  # fmt: skip
        self.loaded[unit] = slot
        return op_id

    def update(
        self,
        order: list[int],
        unit: int,
        *,
        deps: list[str],
        grads: Value | None = None,
        release: tuple[str, ...] = (),
        scale: Value | None = None,
        rollback: Value | None = None,
    ) -> str:
        """The CPU AdamW of `unit` from its landed `grads` (state read ahead from NVMe first,
        written back after; its pinned weight copy written unless its uploads cast); `order` is
        the order the updates are emitted in, for the read-ahead. With several micro-batches
        the landed gradient is added into the accumulator first (no `grads`: it already was).
        Under global clipping it reads the step's `scale`, or speculates: writes the state as it
        was into `rollback` on the way, for the step's `REDO`."""
        ctx = self.ctx
        reads = self.prefetch(order, order.index(unit))
        if unit in self.loaded:  # a held gradient read back from NVMe
            slot = self.loaded.pop(unit)
            grads, release = ctx.at(values.grads(unit), slot), (*release, slot)
        op_id = ctx.sid(self.step, unit, "adam")
        acc = ctx.home(R.GRAD_ACCUM, unit, "gacc") if ctx.config.grad_accum > 1 else None
        state = self._state(unit)
        added = acc and ctx.at(acc.name, acc.slot, accumulate=True) if grads else None
        copy = None if unit in ctx.cast else ctx.home(R.HOST_WEIGHTS, unit, "w")
        # the saved state goes out by streaming stores, never read first: 12 B/param more with
        # FP32 moments; on the H200's host a saving update of a 3B layer took 33.6 ms against
        # 25.8 ms (plain stores, which read each line first, had taken 47.1 against 30.8)
        # (by the unit, not `rollback`: the search's graphs are built without values)
        saved = FP32 + ctx.config.moment_bytes if unit in ctx.speculated else 0
        ctx.b.emit(op_id, K.ADAM, "cpu", step=self.step, unit=unit,
                   work=adam_work(ctx, unit, saved=saved), deps=[*deps, *reads], release=release,
                   reads=[grads, acc, scale, *state], writes=[added, copy, *state, rollback])  # fmt: skip
        self.write_back(unit, op_id)
        ctx.last_update[unit] = op_id
        return op_id

    def _state(self, unit: int) -> list[Value | None]:
        """Where the update finds the unit's master and moments: RAM, or the staging slots of
        its NVMe stripes (and the master in RAM when only the moments are on NVMe)."""
        ctx = self.ctx
        master = ctx.home(R.MASTER, unit, "master") if (R.MASTER, unit) in ctx.homes else None
        if not self.on_nvme:
            return [master, ctx.home(R.MOMENTS, unit, "moments")]
        stripes = [
            ctx.at(unit_value(unit, f"state{k}"), s) for k, s in enumerate(self.staging[unit])
        ]
        return [*([master] if master else []), *stripes]

    def write_back(self, unit: int, update_op: str) -> None:
        """Emit the writes after `update_op`. The next step's read of the same stripe comes
        later on the same drive's lane, so lane order keeps it behind its write."""
        if not self.on_nvme:
            return
        ctx, d = self.ctx, self.ctx.drives
        share = -(-ctx.params(unit) * self.on_nvme // d)
        for k, slot in enumerate(self.staging.pop(unit)):
            ctx.b.emit(
                ctx.sid(self.step, unit, f"opt.write{k}"),
                K.NVME_WRITE,
                f"nvme{k}",
                step=self.step,
                unit=unit,
                work=Work(bytes=share),
                deps=[update_op],
                release=[slot],
                reads=[ctx.at(unit_value(unit, f"state{k}"), slot)],
                writes=[ctx.home(R.NVME_STATE, unit, f"state{k}")],
            )
