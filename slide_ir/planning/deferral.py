"""Global-norm clipping in the sliding schedule: every update of a step waits for its norm.

`torch.nn.utils.clip_grad_norm_` scales every gradient by one factor computed from all of them,
so no update can be exact before the backward's last gradient is known. Each unit's
`GRAD_NORM` runs where its step's gradient is whole, as soon as it is: on the GPU for a
device-updated unit right after its backward, on the host for the others once their gradient
has landed (adding the last micro-batch into the accumulator on the way). `NORM` on the `cpu`
lane combines them (the per-parameter norms in the model's parameter order, as torch stacks
them) into the scale and the global norm, and only then do the updates run, in unit order
0..n+1: the next step's forward needs its units in that order, so the host updates overlap the
next forward instead of the backward, and each host-updated gradient keeps its landing buffer
until its update (`transfer_terms.landing_buffers`).

A speculated unit (`Ctx.speculated`, chosen by `speculation`) updates as its gradient lands, as
without clipping, saving its old state into its rollback slot on the way; after `NORM` its
`REDO` validates it: nothing to do in a step that needs no clipping (the scale is exactly 1,
so the speculative update was the exact one), else the old state is restored and, unless the
step is skipped, the update redone with the scale. The gradient stays in its landing buffer
(or the accumulator) until then.
"""

from __future__ import annotations

from collections.abc import Callable

from slide_ir.ir.graph import OpKind, PoolRole, Value, Work, slot_id
from slide_ir.planning.emit_context import Ctx
from slide_ir.planning.units import BF16, FP32
from slide_ir.planning.updates import adam_work

K = OpKind
R = PoolRole
NORM_FLOOR_BYTES = 64 << 10  # NORM reads a few floats per unit: priced as a small host pass

# (deps, scale) -> the update's op id; None for a streamed unit's, which `post_norm` emits
# (and records) after the flush
Update = Callable[[list[str], Value | None], str | None]


class DeferredUpdates:
    """One step's norms and the updates waiting for them."""

    def __init__(self, ctx: Ctx, step: int) -> None:
        self.ctx, self.step = ctx, step
        self.norms: list[str] = []  # GRAD_NORM op ids
        self.pending: dict[int, Update] = {}

    def scale(self) -> Value | None:
        """The value `NORM` writes and every update of the step reads."""
        name = f"s{self.step}.clip"
        return self.ctx.at(name, slot_id("pinned_grad_scale", 0))

    def grad_norm(
        self, unit: int, lane: str, deps: list[str], grads: Value | None, *,
        accumulator: bool = False, release: tuple[str, ...] = (),
    ) -> str:  # fmt: skip
        """The unit's per-parameter norms from `grads`; with `accumulator` the landed gradient
        is first added into the unit's FP32 accumulator and the norms are the sum's. Its op id."""
        ctx = self.ctx
        op_id = ctx.sid(self.step, unit, "g.norm")
        p = ctx.params(unit)
        acc = ctx.home(R.GRAD_ACCUM, unit, "gacc") if accumulator else None
        nbytes = p * (BF16 + 2 * FP32) if accumulator else p * (FP32 if lane == "cpu" else BF16)
        ctx.b.emit(op_id, K.GRAD_NORM, lane, step=self.step, unit=unit,
                   work=Work(elements=p, bytes=nbytes), deps=deps, release=release,
                   reads=[grads, acc],
                   writes=[acc and ctx.at(acc.name, acc.slot, accumulate=True),
                           ctx.home(R.GRAD_NORMS, unit, "norms")])  # fmt: skip
        self.norms.append(op_id)
        return op_id

    def defer(self, unit: int, update: Update) -> None:
        """`update` (the unit's update, or the validation of its speculative one) runs after
        `NORM`."""
        self.pending[unit] = update

    def flush(self) -> None:
        """`NORM`, then the waiting updates in unit order."""
        ctx, step = self.ctx, self.step
        units = range(ctx.n + 2)
        norm = f"s{step}.norm"
        ctx.b.emit(norm, K.NORM, "cpu", step=step, unit=0, work=Work(bytes=NORM_FLOOR_BYTES),
                   deps=self.norms,
                   reads=[ctx.home(R.GRAD_NORMS, u, "norms") for u in units],
                   writes=[self.scale()])  # fmt: skip
        for unit in sorted(self.pending):
            if op_id := self.pending[unit]([norm], self.scale()):
                ctx.last_update[unit] = op_id


def redo(
    ctx: Ctx, step: int, unit: int, deps: list[str], *,
    grads: Value | None, scale: Value | None, release: tuple[str, ...],
) -> str:  # fmt: skip
    """The `REDO` of a speculated unit's update; its op id. Its work is what it costs when
    the step rolls back: the update's pass plus the saved state read and written back."""
    op_id = ctx.sid(step, unit, "redo")
    saved = FP32 + ctx.config.moment_bytes
    work = adam_work(ctx, unit, saved=2 * saved)
    acc = ctx.home(R.GRAD_ACCUM, unit, "gacc") if ctx.config.grad_accum > 1 else None
    copy = None if unit in ctx.cast else ctx.home(R.HOST_WEIGHTS, unit, "w")
    state = [ctx.home(R.MASTER, unit, "master"), ctx.home(R.MOMENTS, unit, "moments")]
    ctx.b.emit(op_id, K.REDO, "cpu", step=step, unit=unit, work=work, deps=deps,
               release=release, reads=[grads, acc, scale, ctx.home(R.ROLLBACK, unit, "rollback")],
               writes=[copy, *state])  # fmt: skip
    ctx.last_update[unit] = op_id
    return op_id
