"""The schedules Slide is compared with, on the same compute chain as the sliding one.

- `zero-offload`: BF16 weights and grads stay on the GPU; after the full backward every gradient
  goes down, then every unit is updated on the CPU, then every weight goes up, then the next
  forward starts. Nothing overlaps the update: the baseline the overlap's gain is measured on.
- `gpu-only`: weights, grads, master and moments all on the GPU; a GPU AdamW after the backward.
  When it fits, it is the no-offload reference (the compute-only peak).
"""

from __future__ import annotations

from slide_ir.graph import OpKind, Work
from slide_ir.schedules import (
    Ctx,
    OptimizerIo,
    backward,
    forward,
    gpu_adam_work,
    param_bytes,
    prefetch_activations,
)

K = OpKind


def _units(ctx: Ctx) -> list[int]:
    """Units in the order their gradients complete."""
    return [ctx.n + 1, *range(ctx.n, 0, -1), 0]


def _compute(ctx: Ctx, step: int, micro: int) -> None:
    forward(ctx, step, micro, lambda u: None)
    backward(ctx, step, micro, lambda j: prefetch_activations(ctx, step, micro, j), lambda u: None)


def emit_zero_offload(ctx: Ctx) -> None:
    c = ctx.config
    for step in range(1, c.steps + 1):
        for micro in range(c.grad_accum):
            _compute(ctx, step, micro)
        io, units = OptimizerIo(ctx, step), _units(ctx)
        last_bwd = ctx.oid(step, c.grad_accum - 1, 0, "bwd")
        for u in units:
            ctx.b.emit(
                ctx.sid(step, u, "g.d2h"),
                K.D2H_GRAD,
                "d2h",
                step=step,
                unit=u,
                work=Work(bytes=param_bytes(ctx, u)),
                deps=[last_bwd],
            )
        all_down = ctx.sid(step, units[-1], "g.d2h")
        for u in units:
            io.update(units, u, deps=[all_down])
        all_updated = ctx.sid(step, units[-1], "adam")
        for u in units:
            op_id = ctx.sid(step, u, "w.h2d")
            ctx.b.emit(
                op_id,
                K.H2D_PARAM,
                "h2d",
                step=step,
                unit=u,
                work=Work(bytes=param_bytes(ctx, u)),
                deps=[all_updated],
            )
            ctx.weights_ready[u] = op_id


def emit_gpu_only(ctx: Ctx) -> None:
    c = ctx.config
    for step in range(1, c.steps + 1):
        for micro in range(c.grad_accum):
            _compute(ctx, step, micro)
        for u in _units(ctx):
            ctx.b.emit(
                ctx.sid(step, u, "gpu_adam"),
                K.GPU_ADAM,
                "gpu",
                step=step,
                unit=u,
                work=gpu_adam_work(ctx, u),
            )
