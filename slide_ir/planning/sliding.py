"""The sliding schedule: the GPU as a window over the layers.

Per step (and micro-batch): the embedding and decoder layers are uploaded into a ring of cache
units `cache_units - 1` layers ahead of the forward; the last of them stay on the GPU into the
backward. In backward, layer j's gradients go down on `d2h` as soon as its backward ends and its
AdamW update runs on `cpu` while the GPU computes layer j-1. The next step's upload of a unit
waits for that unit's update (and, where the unit has no pinned copy, for the cast of its
master into a staging ring: `weight_ring`). Resident units never move: a GPU AdamW updates them
in place.

Streamed units (see `streaming`) slide like the others, but their FP32 state comes up on `h2d`
before their backward, a GPU AdamW updates them after it, and the new BF16 weights, then the
state, go down on `d2h`. The next step's upload waits for the weights only; the next state
upload waits for the state. Each streamed unit has a GPU state slot of its own, so the state
can travel when the link is free rather than when the unit is next (`_StateTraffic`).

Under global clipping a streamed unit keeps its cache unit and updates after the norm, on the
copy engines' lane (`post_norm`).
"""

from __future__ import annotations

from slide_ir.ir.graph import OpKind, PoolRole, Work
from slide_ir.planning.deferral import DeferredUpdates, redo
from slide_ir.planning.emit_context import (
    Ctx,
    h2d_into,
    host_state,
    param_bytes,
    state_bytes,
    unit_group,
)
from slide_ir.planning.post_norm import PostNormUpdates
from slide_ir.planning.schedules import backward, forward, prefetch_activations
from slide_ir.planning.transfer_terms import landing_pool
from slide_ir.planning.updates import OptimizerIo, device_update, gpu_adam_work, grad_accum_work
from slide_ir.planning.values import grads, weights
from slide_ir.planning.weight_ring import cast_for_upload

K = OpKind
R = PoolRole


def emit_sliding(ctx: Ctx) -> None:
    """Every step's micro-batches; under global clipping see `deferral`."""
    c, n = ctx.config, ctx.n
    layers, ahead = sliding_layers(ctx)
    ctx.kept = frozenset(layers[len(layers) - ahead :]) if ahead else frozenset()
    post_norm = PostNormUpdates(ctx)
    if c.deferred_updates:  # a streamed unit keeps its cache unit (`post_norm`)
        ctx.kept |= ctx.streamed
    ctx.persistent_grads = ctx.resident
    ctx.taped = frozenset(range(n - c.kept_tapes + 1, n + 1))
    for step in range(1, c.steps + 1):
        io = OptimizerIo(ctx, step)
        order = [u for u in (n + 1, *range(n, 0, -1), 0) if u not in ctx.resident]
        for micro in range(c.grad_accum):
            last = micro == c.grad_accum - 1
            _Micro(ctx, step, micro, last, layers, ahead, io, order, post_norm).run()
    post_norm.finish()


def sliding_layers(ctx: Ctx) -> tuple[list[int], int]:
    """The decoder layers that slide, and how many of them the uploads run ahead of the
    compute (the cache ring's depth less the slot in use)."""
    layers = [i for i in range(1, ctx.n + 1) if i not in ctx.resident]
    return layers, max(min(ctx.config.cache_depth, len(layers)) - 1, 0)


class WeightUploads:
    """A micro-batch's weight uploads into the cache ring, `ahead` layers ahead of its forward
    (and of its backward, for the units the forward did not keep): the training step's, and
    an eval batch's forward alone (`evaluation`)."""

    def __init__(self, ctx: Ctx, step: int, micro: int, layers: list[int], ahead: int) -> None:
        self.ctx, self.step, self.micro = ctx, step, micro
        self.layers, self.ahead = layers, ahead
        self.uploaded: dict[str, set[int]] = {"fwd": set(), "bwd": set()}
        self.phase = "fwd"

    def before_forward(self, unit: int) -> None:
        n = self.ctx.n
        if unit == 0:
            self._upload_layers(self.layers, 0)
            self._upload(0)
        elif unit in self.layers:
            self._upload_layers(self.layers, self.layers.index(unit))
        if unit == n + 1 or self.uploaded["fwd"].issuperset(self.layers):
            self._upload(n + 1)

    def _upload_layers(self, order: list[int], pos: int) -> None:
        for u in order[pos : pos + self.ahead + 1]:
            self._upload(u)

    def _upload(self, unit: int) -> None:
        ctx = self.ctx
        done = self.uploaded[self.phase]
        if unit in ctx.resident or unit in ctx.unit_slot or unit in done:
            return
        done.add(unit)
        pool = "gpu_units" if 1 <= unit <= ctx.n else f"gpu_{unit_group(ctx, unit)}"
        what = "w.h2d" if self.phase == "fwd" else "w.h2d.bwd"
        op_id = ctx.oid(self.step, self.micro, unit, what)
        after, staged = ctx.last_update.get(unit), None
        if unit in ctx.cast:
            cast = ctx.oid(self.step, self.micro, unit, what.replace("h2d", "cast"))
            staged = cast_for_upload(ctx, cast, self.step, unit, after)
            after, src = cast, ctx.at(weights(unit), staged)
        else:
            src = ctx.home(R.HOST_WEIGHTS, unit, "w")
        slot = h2d_into(ctx, op_id, K.H2D_PARAM, self.step, unit, param_bytes(ctx, unit), after,
                       pool, [src], release=staged)  # fmt: skip
        ctx.unit_slot[unit], ctx.weights_ready[unit] = slot, op_id


class _Micro(WeightUploads):
    """One micro-batch of the sliding schedule: prefetch bookkeeping plus the compute chain."""

    def __init__(
        self,
        ctx: Ctx,
        step: int,
        micro: int,
        last: bool,
        layers: list[int],
        ahead: int,
        io: OptimizerIo,
        order: list[int],
        post_norm: PostNormUpdates,
    ) -> None:
        super().__init__(ctx, step, micro, layers, ahead)
        self.last, self.io, self.order, self.post_norm = last, io, order, post_norm
        self.state = _StateTraffic(ctx, step)
        # global clipping: the last micro-batch's updates wait for the norm, then run 0..n+1
        use = last and ctx.config.deferred_updates
        self.deferred = DeferredUpdates(ctx, step) if use else None
        self.io_order = sorted(order)

    def run(self) -> None:
        ctx = self.ctx
        forward(ctx, self.step, self.micro, self.before_forward)
        self.after_bwd(ctx.n + 1)
        self.phase = "bwd"
        backward(ctx, self.step, self.micro, self.before_backward, self.after_bwd)
        self.state.flush_downloads()
        if self.deferred:
            self.deferred.flush()
            self.post_norm.run()

    # -- prefetch ------------------------------------------------------------------------------
    def before_forward(self, unit: int) -> None:
        super().before_forward(unit)
        if unit == self.ctx.n + 1:
            self.state.upload_share(through=unit)

    def before_backward(self, layer: int) -> None:
        ctx = self.ctx
        back = self.layers[::-1]
        if layer in back:
            self._upload_layers(back, back.index(layer))
        prefetch_activations(ctx, self.step, self.micro, layer)
        self.state.upload_share(through=layer)

    # -- gradients -----------------------------------------------------------------------------
    def after_bwd(self, unit: int) -> None:
        ctx = self.ctx
        produced_by = ctx.oid(self.step, self.micro, unit, "loss" if unit == ctx.n + 1 else "bwd")
        if unit in ctx.streamed and self.deferred:
            self._streamed_deferred(unit, produced_by, self.deferred)
        elif unit in ctx.streamed:
            self._streamed_update(unit)
        elif unit in ctx.resident:
            self._resident_update(unit, produced_by)
        else:
            d2h, landing = self._grad_down(unit, produced_by)
            if self.last:
                self._host_update(unit, d2h, landing)
            else:
                self._accumulate(unit, d2h, landing)

    def _resident_update(self, unit: int, produced_by: str) -> None:
        """A resident unit updates on the GPU after its last micro-batch (under global clipping,
        once the norm is known)."""
        ctx, step = self.ctx, self.step
        if self.last and self.deferred:
            self.deferred.grad_norm(
                unit, "gpu", [produced_by], ctx.at(grads(unit), ctx.on_gpu(unit))
            )
            self.deferred.defer(
                unit, lambda deps, scale: device_update(ctx, step, unit, deps, scale)
            )
        elif self.last:
            ctx.last_update[unit] = device_update(ctx, step, unit)

    def _grad_down(self, unit: int, produced_by: str) -> tuple[str, str]:
        """A sliding unit's gradient down to a landing buffer: (the copy's id, the buffer)."""
        ctx, step = self.ctx, self.step
        d2h = ctx.oid(step, self.micro, unit, "g.d2h")
        on_gpu = ctx.unit_slot.pop(unit)
        accumulates = ctx.config.grad_accum > 1  # the norm is the accumulated gradient's
        taken = [produced_by]
        if self.last and self.deferred and not accumulates:
            # the norm where the gradient is whole first: one pass over it on the GPU is a
            # fraction of a millisecond, on the host (the lane that bounds sliding) ~13 ms a layer
            taken.append(self.deferred.grad_norm(
                unit, "gpu", [produced_by], ctx.at(grads(unit), on_gpu)))  # fmt: skip
        (landing,) = ctx.b.emit(
            d2h,
            K.D2H_GRAD,
            "d2h",
            step=step,
            unit=unit,
            work=Work(bytes=param_bytes(ctx, unit)),
            deps=taken,
            acquire=[landing_pool(ctx.b.pools, unit)],
            release=[on_gpu],
            reads=[ctx.at(grads(unit), on_gpu)],
            writes=[ctx.taken(grads(unit))],
        )
        return d2h, landing

    def _accumulate(self, unit: int, d2h: str, landing: str) -> None:
        """A micro-batch before the last adds its landed gradient into the host accumulator."""
        ctx = self.ctx
        acc = ctx.home(R.GRAD_ACCUM, unit, "gacc")
        ctx.b.emit(
            ctx.oid(self.step, self.micro, unit, "g.accum"),
            K.GRAD_ACCUM,
            "cpu",
            step=self.step,
            unit=unit,
            work=grad_accum_work(ctx, unit),
            deps=[d2h],
            release=[landing],
            reads=[ctx.at(grads(unit), landing)],
            writes=[acc and ctx.at(acc.name, acc.slot, accumulate=self.micro > 0)],
        )

    def _host_update(self, unit: int, d2h: str, landing: str) -> None:
        """The host AdamW of a landed gradient: at once, or under global clipping speculated
        (redone if the norm says so) or deferred to the norm (its gradient kept or spilled)."""
        ctx, step = self.ctx, self.step
        landed = ctx.at(grads(unit), landing)
        if not self.deferred:
            self.io.update(self.order, unit, deps=[d2h], grads=landed, release=(landing,))
            return
        kept, landed_at = landed, d2h
        release: tuple[str, ...] = (landing,)
        if ctx.config.grad_accum > 1:  # the whole gradient is the host's sum: its norm there
            kept, release = None, ()
            landed_at = self.deferred.grad_norm(unit, "cpu", [d2h], landed, accumulator=True,
                                                release=(landing,))  # fmt: skip
        if unit in ctx.speculated:
            guess = self.io.update(self.io_order, unit, deps=[landed_at], grads=kept,
                                   rollback=ctx.home(R.ROLLBACK, unit, "rollback"))  # fmt: skip
            self.deferred.defer(unit, lambda deps, scale: redo(
                ctx, step, unit, [*deps, guess], grads=kept, scale=scale, release=release))  # fmt: skip
            return
        if ctx.config.spills_grads:  # held on the drive until the norm, read back to update
            self.io.spill(unit, kept, landed_at, landing)
            kept, release = None, ()
        self.deferred.defer(unit, lambda deps, scale: self.io.update(
            self.io_order, unit, deps=[*deps, landed_at], grads=kept, release=release,
            scale=scale))  # fmt: skip

    def _streamed_update(self, unit: int) -> None:
        """GPU AdamW of a streamed unit, then its new BF16 weights (and maybe its state) go down."""
        ctx, step = self.ctx, self.step
        adam = ctx.sid(step, unit, "gpu_adam")
        slot, state = ctx.unit_slot.pop(unit), ctx.at(f"L{unit}.state", ctx.opt_slot[unit])
        w = ctx.at(weights(unit), slot)
        ctx.b.emit(adam, K.GPU_ADAM, "gpu", step=step, unit=unit, work=gpu_adam_work(ctx, unit),
                   deps=[ctx.opt_ready.pop(unit)], reads=[ctx.at(grads(unit), slot), state],
                   writes=[w, state])  # fmt: skip
        down = ctx.sid(step, unit, "w.d2h")
        ctx.b.emit(down, K.W_D2H, "d2h", step=step, unit=unit,
                   work=Work(bytes=param_bytes(ctx, unit)), deps=[adam], release=[slot],
                   reads=[w], writes=[ctx.home(R.HOST_WEIGHTS, unit, "w")])  # fmt: skip
        ctx.last_update[unit] = down
        self.state.updated(unit)

    def _streamed_deferred(self, unit: int, produced_by: str, deferred: DeferredUpdates) -> None:
        """Global clipping: the unit's norm from its cache unit, which keeps the gradient for
        the update after the norm (`post_norm`)."""
        ctx, step = self.ctx, self.step
        on_gpu = ctx.at(grads(unit), ctx.unit_slot[unit])
        deferred.grad_norm(unit, "gpu", [produced_by], on_gpu)
        deferred.defer(unit, lambda deps, scale: self.post_norm.defer(step, unit, deps, scale))


class _StateTraffic:
    """When a step's streamed state crosses the link.

    Uploads are spread evenly over the loss and the n decoder layers' backward, each phase's
    share behind its weight and activation prefetches, the embedding's and head's first (the
    loss leaves the link idle) and then the layers' in the order the backward updates them:
    a streamed layer alone needs more link time than its backward takes, so uploading each
    just before its backward stalls the GPU there while the link idles through the
    host-updated layers. Downloads follow their unit's new weights, except for the last units
    to update: as many states as the next forward and loss can carry (`StatePace.spill_s`)
    wait until the backward is done, so the backward's tail runs at the GPU's pace; they go
    down in the order the next step uploads them."""

    def __init__(self, ctx: Ctx, step: int) -> None:
        self.ctx, self.step = ctx, step
        n = ctx.n
        # under global clipping the state moves after the norm (`post_norm`)
        moves = not ctx.config.deferred_updates
        self.order = [u for u in (0, n + 1, *range(n, 0, -1)) if u in ctx.streamed and moves]
        self.to_upload = list(self.order)
        self.total = sum(state_bytes(ctx, u) for u in self.order)
        self.sent = 0
        self.phases = 0
        self.deferred: list[int] = []
        self.defer = self._spilled()

    def _spilled(self) -> set[int]:
        """The last streamed units to update whose states fit in the spill budget."""
        ctx = self.ctx
        budget = ctx.pace.spill_s * ctx.pace.link_bytes_per_s
        out: set[int] = set()
        for unit in (0, *range(1, ctx.n + 2)):  # the reverse of the update order
            if unit not in ctx.streamed:
                continue
            budget -= state_bytes(ctx, unit)
            if budget < 0:
                break
            out.add(unit)
        return out

    def upload_share(self, through: int) -> None:
        """One phase: every upload up to `through`'s (its update is next), then more until the
        bytes sent reach this phase's share."""
        self.phases += 1
        target = self.total * self.phases / (self.ctx.n + 1)
        if through in self.to_upload:
            for unit in self.to_upload[: self.to_upload.index(through) + 1]:
                self._upload(unit)
        while self.to_upload and self.sent < target:
            self._upload(self.to_upload[0])

    def _upload(self, unit: int) -> None:
        ctx = self.ctx
        self.to_upload.remove(unit)
        self.sent += state_bytes(ctx, unit)
        op_id, pool = ctx.sid(self.step, unit, "opt.h2d"), f"gpu_opt_{unit_group(ctx, unit)}"
        after = ctx.state_ready.get(unit)
        slot = h2d_into(ctx, op_id, K.OPT_H2D, self.step, unit, state_bytes(ctx, unit), after,
                       pool, host_state(ctx, unit), "state")  # fmt: skip
        ctx.opt_slot[unit], ctx.opt_ready[unit] = slot, op_id

    def updated(self, unit: int) -> None:
        if unit in self.defer:
            self.deferred.append(unit)
        else:
            self._download(unit)

    def flush_downloads(self) -> None:
        for unit in sorted(self.deferred, key=self.order.index):
            self._download(unit)

    def _download(self, unit: int) -> None:
        ctx, step = self.ctx, self.step
        op_id = ctx.sid(step, unit, "opt.d2h")
        slot = ctx.opt_slot.pop(unit)
        ctx.b.emit(op_id, K.OPT_D2H, "d2h", step=step, unit=unit,
                   work=Work(bytes=state_bytes(ctx, unit)), deps=[ctx.sid(step, unit, "gpu_adam")],
                   release=[slot], reads=[ctx.at(f"L{unit}.state", slot)],
                   writes=host_state(ctx, unit))  # fmt: skip
        ctx.state_ready[unit] = op_id
