"""The eval graph: forward-only passes over eval batches on a training plan's pools.

An eval batch runs as the training step's forward does (each sliding unit's weights uploaded
into the cache ring `ahead` layers before its forward, resident units read in place), then the
loss alone (`OpKind.EVAL_LOSS`): no backward, no gradient, no update, no tape, no saved input.
Every unit's slot and every layer input is freed as soon as it is read, so the next batch's
uploads run behind the current batch's forward. Each batch is one step of the graph (one
micro-batch): the executor runs it between training passes, and the simulator prices it like
any graph.

Invariant: an eval graph writes nothing a training graph reads across a step boundary (no
host copy, no resident slot, no optimizer state): the model state after training with eval is
bitwise that of training without.
"""

from __future__ import annotations

from slide_ir.planning.emit_context import Ctx
from slide_ir.planning.schedules import forward
from slide_ir.planning.sliding import WeightUploads, sliding_layers
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec


def emit_eval(ctx: Ctx) -> None:
    """`ctx.config.steps` eval batches (`ctx.forward_only`); the sliding schedule uploads its
    units as its forward does, the others hold every weight on the GPU already."""
    assert ctx.forward_only and ctx.config.grad_accum == 1, "an eval batch is one micro-batch"
    layers, ahead = sliding_layers(ctx)
    for step in range(1, ctx.config.steps + 1):
        if ctx.config.schedule == "sliding":
            forward(ctx, step, 0, WeightUploads(ctx, step, 0, layers, ahead).before_forward)
        else:
            forward(ctx, step, 0, lambda unit: None)


def eval_flops_per_batch(model: ModelSpec, config: TrainConfig) -> float:
    """Model FLOPs of one eval batch: every layer's forward and the head's."""
    b, s = config.batch, config.seq
    return model.num_layers * model.layer_fwd_flops(b, s) + model.head_fwd_flops(b, s)
