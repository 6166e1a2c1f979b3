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
until its update (`ledger.landing_buffers`).
"""

from __future__ import annotations

from collections.abc import Callable

from slide_ir.ir.graph import OpKind, PoolRole, Value, Work, slot_id
from slide_ir.planning.ledger import BF16, FP32
from slide_ir.planning.schedules import Ctx

K = OpKind
R = PoolRole
NORM_FLOOR_BYTES = 64 << 10  # NORM reads a few floats per unit: priced as a small host pass

Update = Callable[[list[str], Value | None], str]  # (deps, scale) -> the update's op id


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
    ) -> None:  # fmt: skip
        """The unit's per-parameter norms from `grads`; with `accumulator` the landed gradient
        is first added into the unit's FP32 accumulator and the norms are the sum's."""
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

    def defer(self, unit: int, update: Update) -> None:
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
            ctx.last_update[unit] = self.pending[unit]([norm], self.scale())
