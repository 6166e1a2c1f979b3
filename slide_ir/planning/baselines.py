"""The schedules Slide is compared with, on the same compute chain as the sliding one.

- `zero-offload`: DeepSpeed ZeRO-2 with CPU offload on one GPU, as DeepSpeed runs it
  (`slide_ir.planning.zero_offload`): BF16 weights stay on the GPU; gradients go down in reduce buckets as
  the backward produces them, each flush on the compute stream (the `gpu` lane: DeepSpeed's
  default without overlap_comm), as FP32 into a pinned host buffer; after the backward, the CPU
  updates every unit, casts every master to BF16, and every weight goes up; then the next
  forward starts. Nothing of the update overlaps: the baseline the overlap's gain is measured on.
  With several micro-batches, the earlier ones' buckets are added into host FP32 accumulators
  on the `cpu` lane (DeepSpeed accumulates through the GPU instead: an upload, an add and a
  download per parameter and micro-batch; the link bytes are the same).
- `gpu-only`: weights, grads, master and moments all on the GPU; a GPU AdamW after the backward.
  When it fits, it is the no-offload reference (the compute-only peak).

Both update after the whole backward already, so global clipping (`deferral`) costs them only
its norms: each unit's `GRAD_NORM` where its gradient is (the GPU for gpu-only, the landed FP32
gradient on the host for zero-offload, as DeepSpeed takes the norm before its CPU step), then
`NORM`, then the updates as before, reading the scale.
"""

from __future__ import annotations

import functools

from slide_ir.ir.graph import OpKind, PoolRole, Value, Work
from slide_ir.planning.deferral import DeferredUpdates
from slide_ir.planning.emit_context import Ctx, param_bytes
from slide_ir.planning.schedules import backward, forward, prefetch_activations
from slide_ir.planning.units import FP32
from slide_ir.planning.updates import OptimizerIo, device_update
from slide_ir.planning.values import grads
from slide_ir.planning.zero_offload import GradBucket, grad_buckets, grad_order, unit_elements

K = OpKind
R = PoolRole


def _units(ctx: Ctx) -> list[int]:
    """Units in the order their gradients complete."""
    return [ctx.n + 1, *range(ctx.n, 0, -1), 0]


def _compute(ctx: Ctx, step: int, micro: int) -> None:
    forward(ctx, step, micro, lambda u: None)
    backward(ctx, step, micro, lambda j: prefetch_activations(ctx, step, micro, j), lambda u: None)


class _Flushes:
    """Emits each bucket's downloads once its last unit's gradient is complete."""

    def __init__(self, ctx: Ctx, step: int, micro: int, buckets: tuple[GradBucket, ...]) -> None:
        self.ctx, self.step, self.micro = ctx, step, micro
        self.closing = {b.last: b for b in buckets}
        self.landed: dict[int, str] = {}  # unit -> its d2h op this micro-batch
        self.accumulated: dict[int, str] = {}  # unit -> grad_accum op of the previous micro

    def after(self, unit: int) -> None:
        """Unit `unit`'s gradient is complete (its backward, or the loss for the head)."""
        bucket = self.closing.get(unit)
        if bucket is None:
            return
        ctx = self.ctx
        for u in bucket.units:
            op_id = ctx.oid(self.step, self.micro, u, "g.d2h")
            producer = ctx.oid(self.step, self.micro, u, "loss" if u == ctx.n + 1 else "bwd")
            ctx.b.emit(op_id, K.D2H_GRAD, "gpu", step=self.step, unit=u,
                       work=Work(bytes=unit_elements(ctx.model, u) * FP32),
                       deps=[producer, self.accumulated.get(u)],
                       reads=[ctx.at(grads(u), ctx.grads_on_gpu(u))],
                       writes=[_landed(ctx, u)])  # fmt: skip
            self.landed[u] = op_id


def _micro_batch(ctx: Ctx, step: int, micro: int, buckets: tuple[GradBucket, ...],
                 accumulated: dict[int, str]) -> dict[int, str]:  # fmt: skip
    """Forward and backward of one micro-batch with its flushes; returns unit -> its d2h."""
    flushes = _Flushes(ctx, step, micro, buckets)
    flushes.accumulated = accumulated
    forward(ctx, step, micro, lambda u: None)
    flushes.after(ctx.n + 1)
    backward(ctx, step, micro, lambda j: prefetch_activations(ctx, step, micro, j), flushes.after)
    return flushes.landed


def _landed(ctx: Ctx, unit: int) -> Value | None:
    """A unit's FP32 gradient in the pinned buffer it lands in."""
    return ctx.home(R.GRAD_LANDING, unit, "g")


def _accumulate(ctx: Ctx, step: int, micro: int, landed: dict[int, str]) -> dict[int, str]:
    """Add a micro-batch's landed gradients into the host accumulators (not the last one's:
    the update adds those)."""
    out = {}
    for u in grad_order(ctx.model):
        if u not in landed:
            continue
        op_id = ctx.oid(step, micro, u, "grad_accum")
        p = unit_elements(ctx.model, u)
        acc = ctx.home(R.GRAD_ACCUM, u, "gacc")
        ctx.b.emit(op_id, K.GRAD_ACCUM, "cpu", step=step, unit=u,
                   work=Work(elements=p, bytes=p * 3 * FP32), deps=[landed[u]],
                   reads=[_landed(ctx, u)],
                   writes=[acc and ctx.at(acc.name, acc.slot, accumulate=micro > 0)])  # fmt: skip
        out[u] = op_id
    return out


def emit_zero_offload(ctx: Ctx) -> None:
    c, model = ctx.config, ctx.model
    buckets = grad_buckets(model, c)
    units = [u for u in grad_order(model) if unit_elements(model, u)]
    for step in range(1, c.steps + 1):
        accumulated: dict[int, str] = {}
        for micro in range(c.grad_accum):
            landed = _micro_batch(ctx, step, micro, buckets, accumulated)
            if micro < c.grad_accum - 1:
                accumulated = _accumulate(ctx, step, micro, landed)
        io = OptimizerIo(ctx, step)
        all_down = landed[units[-1]]  # DeepSpeed's norm reads (.item()) wait for every copy
        if c.deferred_updates:
            _clipped_host_updates(ctx, step, io, units, all_down)
        else:
            for u in units:
                io.update(units, u, deps=[all_down], grads=_landed(ctx, u))
        for u in units:  # DeepSpeed casts the whole FP32 partition into the pinned BF16 buffer
            p = unit_elements(model, u)
            master = [ctx.home(R.MASTER, u, "master")] if (R.MASTER, u) in ctx.homes else []
            ctx.b.emit(ctx.sid(step, u, "cast"), K.CAST, "cpu", step=step, unit=u,
                       work=Work(elements=p, bytes=p * (FP32 + 2)), reads=master,
                       writes=[ctx.home(R.HOST_WEIGHTS, u, "w")])  # fmt: skip
        all_cast = ctx.sid(step, units[-1], "cast")
        for u in units:
            op_id = ctx.sid(step, u, "w.h2d")
            ctx.b.emit(op_id, K.H2D_PARAM, "h2d", step=step, unit=u,
                       work=Work(bytes=param_bytes(ctx, u)), deps=[all_cast],
                       reads=[ctx.home(R.HOST_WEIGHTS, u, "w")],
                       writes=[ctx.weights_read(u)])  # fmt: skip
            ctx.weights_ready[u] = op_id


def _clipped_host_updates(
    ctx: Ctx, step: int, io: OptimizerIo, units: list[int], all_down: str
) -> None:
    """Each landed gradient's norms (the last micro-batch added into its accumulator on the
    way), the step's norm, then the host updates reading its scale."""
    accumulates = ctx.config.grad_accum > 1
    deferred = DeferredUpdates(ctx, step)
    for u in units:
        deferred.grad_norm(u, "cpu", [all_down], _landed(ctx, u), accumulator=accumulates)
        kept = None if accumulates else _landed(ctx, u)
        deferred.defer(u, functools.partial(_host_update, io, units, u, kept))
    deferred.flush()


def _host_update(
    io: OptimizerIo, units: list[int], unit: int, grads: Value | None, deps: list[str],
    scale: Value | None,
) -> str:  # fmt: skip
    return io.update(units, unit, deps=deps, grads=grads, scale=scale)


def emit_gpu_only(ctx: Ctx) -> None:
    c = ctx.config
    ctx.persistent_grads = frozenset(_units(ctx))
    last = c.grad_accum - 1
    for step in range(1, c.steps + 1):
        for micro in range(c.grad_accum):
            _compute(ctx, step, micro)
        if not c.deferred_updates:
            for u in _units(ctx):
                device_update(ctx, step, u)
            continue
        deferred = DeferredUpdates(ctx, step)
        for u in _units(ctx):
            done = ctx.oid(step, last, u, "loss" if u == ctx.n + 1 else "bwd")
            deferred.grad_norm(u, "gpu", [done], ctx.at(grads(u), ctx.on_gpu(u)))
            deferred.defer(u, functools.partial(device_update, ctx, step, u))
        deferred.flush()
