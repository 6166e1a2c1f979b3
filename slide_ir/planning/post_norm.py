"""Streamed units under global clipping: their GPU AdamW after the norm, on the copy engines'
lane, in turn through a few GPU state slots.

Without clipping a streamed unit's state comes up before its backward and goes down after its
update (`sliding._StateTraffic`), a GPU slot per unit. Under global clipping no update may run
before the norm, which the backward's last gradient completes. A streamed unit then keeps its
cache unit (BF16 weights and gradient: 4 B/param, where a resident unit holds 16) for the whole
step, and its FP32 state takes turns through `state_terms.POST_NORM_STATE_SLOTS` GPU slots: the
first states go up at the backward's end (they do not need the norm); after the norm each
unit's GPU AdamW runs on the `h2d` lane right behind its state's upload, its kernel on that
lane's stream, so the compute lane starts the next forward at once and waits only where it
reaches a unit whose update has not run; the state goes down, and the next state goes up into
the slot. The copy engines carry these units' updates while the host updates the others. A
step's updates need nothing of the next step (a save or a Ctrl-C between steps waits for them
alone). After a graph's last step the new weights go down too: the next pass uploads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from slide_ir.ir.graph import OpKind, PoolRole, Value, Work
from slide_ir.planning.emit_context import (
    Ctx,
    h2d_into,
    host_state,
    param_bytes,
    state_bytes,
    unit_group,
)
from slide_ir.planning.updates import gpu_adam_work
from slide_ir.planning.values import grads, weights

K = OpKind
R = PoolRole


@dataclass(frozen=True, slots=True)
class _Waiting:
    step: int
    deps: list[str]  # the norm
    scale: Value | None


class PostNormUpdates:
    """One graph's streamed updates waiting for a norm, and their states' turns."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.waiting: dict[int, _Waiting] = {}
        self.queue: list[int] = []  # units whose state waits for a slot, in update order
        self.up: dict[int, tuple[str, str]] = {}  # unit -> (its state's upload, the slot)
        self.slots = {p.name: p.slots for p in ctx.b.pools if p.role == R.STREAM_STATE}

    def defer(self, step: int, unit: int, deps: list[str], scale: Value | None) -> None:
        """`unit`'s update of `step` waits for `deps` (the norm); `run` emits it."""
        self.waiting[unit] = _Waiting(step, deps, scale)
        self.queue.append(unit)

    def run(self) -> None:
        """The step's waiting updates, in unit order (the next forward's). A state goes up
        just before its update in the lane's order: an upload waits for a slot to come free
        (the state two units back going down), and an update queued behind it would wait
        too, though its own state is already up: uploads and downloads then alternate on
        the link instead of running both ways at once."""
        self.queue.sort()
        self._send()
        for unit in sorted(self.waiting):
            if unit not in self.up:
                self._send(1)
            self._update(unit)

    def finish(self) -> None:
        """The graph's end: every streamed unit's new weights down (the next pass uploads
        them), its cache unit freed."""
        ctx = self.ctx
        for unit in sorted(ctx.streamed):
            if unit not in ctx.unit_slot:
                continue
            slot, step = ctx.unit_slot.pop(unit), ctx.config.steps
            down = ctx.sid(step, unit, "w.d2h")
            ctx.b.emit(down, K.W_D2H, "d2h", step=step, unit=unit,
                       work=Work(bytes=param_bytes(ctx, unit)), deps=[ctx.last_update[unit]],
                       release=[slot], reads=[ctx.at(weights(unit), slot)],
                       writes=[ctx.home(R.HOST_WEIGHTS, unit, "w")])  # fmt: skip
            ctx.last_update[unit] = down

    def _pool(self, unit: int) -> str:
        return f"gpu_opt_{unit_group(self.ctx, unit)}"

    def _send(self, most: int | None = None) -> None:
        """Upload waiting states in turn (`most` of them, or all) while their pool has a
        slot free."""
        while self.queue and most != 0:
            pool = self._pool(self.queue[0])
            if sum(self._pool(u) == pool for u in self.up) == self.slots[pool]:
                return
            unit = self.queue.pop(0)
            op_id = self.ctx.sid(self.waiting[unit].step, unit, "opt.h2d")
            slot = h2d_into(self.ctx, op_id, K.OPT_H2D, self.waiting[unit].step, unit,
                            state_bytes(self.ctx, unit), self.ctx.state_ready.get(unit), pool,
                            host_state(self.ctx, unit), "state")  # fmt: skip
            self.up[unit] = (op_id, slot)
            most = None if most is None else most - 1

    def _update(self, unit: int) -> None:
        ctx, wait = self.ctx, self.waiting.pop(unit)
        step = wait.step
        up, state_slot = self.up.pop(unit)
        slot = ctx.unit_slot[unit]
        state, w = ctx.at(f"L{unit}.state", state_slot), ctx.at(weights(unit), slot)
        adam = ctx.sid(step, unit, "gpu_adam")
        ctx.b.emit(adam, K.GPU_ADAM, "h2d", step=step, unit=unit, work=gpu_adam_work(ctx, unit),
                   deps=[*wait.deps, up], reads=[ctx.at(grads(unit), slot), state, wait.scale],
                   writes=[w, state])  # fmt: skip
        ctx.weights_ready[unit] = ctx.last_update[unit] = adam
        state_down = ctx.sid(step, unit, "opt.d2h")
        ctx.b.emit(state_down, K.OPT_D2H, "d2h", step=step, unit=unit,
                   work=Work(bytes=state_bytes(ctx, unit)), deps=[adam], release=[state_slot],
                   reads=[state], writes=host_state(ctx, unit))  # fmt: skip
        ctx.state_ready[unit] = state_down
