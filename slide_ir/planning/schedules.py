"""The compute chain every schedule shares: forward, fused loss, checkpointed backward.

Units ("unit" in op ids): 0 embedding, 1..n decoder layers, n+1 head. Every schedule uses
sliding activation checkpointing: each decoder layer's input is saved (kept on the GPU, or copied
to pinned CPU memory, or on to NVMe), brought back ahead of the backward, and the layer recomputed.
Except the `taped` layers (the top ones, `TrainConfig.keep_activations`): their forward records
`s1.L3.tape` into a `gpu_tapes` slot and frees its input, and their backward reads that tape.
Schedules differ in where weights come from and where gradients go; they plug in through the
`before_*` / `after_bwd` hooks. Every op names the values it reads and writes (`slide_ir.planning.values`):
the forward passes `s1.L3.x` from slot to slot, the recompute leaves `s1.L3.tape` in the
workspace for the backward, the backward passes `s1.L3.dx` down a two-slot ring.
The emitters' state is a `Ctx` (`emit_context`); the update ops they share are in `updates`.
"""

from __future__ import annotations

from collections.abc import Callable

from slide_ir.ir.drives import act_drive, act_pool
from slide_ir.ir.graph import FEED_AHEAD, OpKind, Role, Work
from slide_ir.planning.compute_terms import lce_chunk_tokens
from slide_ir.planning.emit_context import Ctx
from slide_ir.planning.shapes import eval_loss_work, loss_work

K = OpKind


Hook = Callable[[int], None]


def forward(ctx: Ctx, step: int, micro: int, before_layer: Hook) -> None:
    """Embedding, decoder layers 1..n, then the fused loss (LCE: forward and backward at once).
    `before_layer(u)` runs before unit u's compute is emitted (to issue prefetches)."""
    m, n, b = ctx.model, ctx.n, ctx.b

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    b.micro = micro  # what follows, up to the next micro-batch's forward, belongs to it
    before_layer(0)
    ctx.grads_written.clear()
    # forward only: the embedding's slot is free after its lookup, unless the LM head reads it
    embedding_done = ctx.forward_only and not m.tied_embeddings and 0 in ctx.unit_slot
    # the driver stages this micro-batch once the step that last used its host slot is done
    staged_after = b.tails(step - 1 - FEED_AHEAD) if micro == 0 else ()
    (x1,) = b.emit(
        oid(0, "fwd"),
        K.FWD,
        "gpu",
        step=step,
        unit=0,
        work=Work(bytes=ctx.hidden_bytes),
        deps=[ctx.weights_ready.get(0), *staged_after],
        acquire=["gpu_acts"],
        # the weights before the release below gives their slot up
        reads=[ctx.weights_read(0), ctx.fed(step, micro)],
        release=[ctx.unit_slot.pop(0) if embedding_done else None],
        writes=[ctx.taken(oid(1, "x")), ctx.tokens(step, micro)],
    )
    ctx.act_gpu[1], ctx.act_ready[1] = x1, oid(0, "fwd")
    for i in range(1, n + 1):
        before_layer(i)
        _layer_forward(ctx, step, micro, i)
    before_layer(n + 1)
    if ctx.forward_only:
        _eval_loss(ctx, step, micro)
        return
    _loss(ctx, step, micro)


def _layer_forward(ctx: Ctx, step: int, micro: int, i: int) -> None:
    """Decoder layer i's forward: its input is freed (taped or forward-only) or saved (off the
    GPU unless activations stay there); its unit's slot is freed unless the backward keeps it."""

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    done_with_unit = i not in ctx.kept and i in ctx.unit_slot
    taped = i in ctx.taped
    input_done = taped or ctx.forward_only
    slots = ctx.b.emit(
        oid(i, "fwd"),
        K.FWD,
        "gpu",
        step=step,
        unit=i,
        work=ctx.layer_work("fwd"),
        deps=[ctx.weights_ready.get(i)],
        acquire=["gpu_acts", "gpu_tapes"] if taped else ["gpu_acts"],
        scratch=["gpu_workspace"],
        release=[ctx.unit_slot[i] if done_with_unit else None,
                 ctx.act_gpu[i] if input_done else None],
        reads=[ctx.weights_read(i), ctx.at(oid(i, "x"), ctx.act_gpu[i])],
        writes=[ctx.taken(oid(i + 1, "x")),
                ctx.taken(oid(i, "tape"), 1, Role.TAPE) if taped else None],
    )  # fmt: skip
    if done_with_unit:
        del ctx.unit_slot[i]
    ctx.act_gpu[i + 1], ctx.act_ready[i + 1] = slots[0], oid(i, "fwd")
    if taped:
        ctx.tape_slot[i] = slots[1]
    if input_done:
        del ctx.act_gpu[i], ctx.act_ready[i]
    elif ctx.config.activations != "gpu":
        _save_activation(ctx, step, micro, i)


def _loss(ctx: Ctx, step: int, micro: int) -> None:
    """The fused loss (LCE: the head's forward and backward at once): the head's gradient (and a
    tied embedding's, from the LM head) and the first hidden-state gradient."""
    m, c, head, tied = ctx.model, ctx.config, ctx.n + 1, ctx.model.tied_embeddings

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    (ctx.hidden_grad[head],) = ctx.b.emit(
        oid(head, "loss"),
        K.LOSS,
        "gpu",
        step=step,
        unit=head,
        work=loss_work(m, c, lce_chunk_tokens(m, c)),
        deps=[ctx.weights_ready.get(head)],
        acquire=["gpu_hidden_grads"],
        scratch=["gpu_workspace"],
        release=[ctx.act_gpu[head]],
        reads=[ctx.weights_read(head), ctx.at(oid(head, "x"), ctx.act_gpu.pop(head)),
               ctx.tokens(step, micro), ctx.weights_read(0, Role.TIED) if tied else None],
        writes=[ctx.grads_write(head, micro), ctx.taken(oid(head, "dx")),
                ctx.grads_write(0, micro, Role.TIED) if tied else None,
                *ctx.losses(step, micro)],
    )  # fmt: skip


def _eval_loss(ctx: Ctx, step: int, micro: int) -> None:
    """The head's forward only: the batch's summed token loss, no gradient written; the head's
    input, and the head's (and a tied embedding's) cache slots, are free after it."""
    head, tied = ctx.n + 1, ctx.model.tied_embeddings
    x = ctx.act_gpu.pop(head)
    ctx.act_ready.pop(head)
    reads = [ctx.weights_read(head), ctx.at(ctx.hidden(step, micro, head, "x"), x),
             ctx.tokens(step, micro), ctx.weights_read(0, Role.TIED) if tied else None]  # fmt: skip
    done = [head, 0] if tied else [head]
    ctx.b.emit(
        ctx.oid(step, micro, head, "loss"),
        K.EVAL_LOSS,
        "gpu",
        step=step,
        unit=head,
        work=eval_loss_work(ctx.model, ctx.config, lce_chunk_tokens(ctx.model, ctx.config)),
        deps=[ctx.weights_ready.get(head)],
        scratch=["gpu_workspace"],
        release=[x, *(ctx.unit_slot.pop(u) for u in done if u in ctx.unit_slot)],
        reads=reads,
        writes=ctx.losses(step, micro),
    )  # fmt: skip


def backward(ctx: Ctx, step: int, micro: int, before_layer: Hook, after_bwd: Hook) -> None:
    """Layers n..1: (load input,) recompute, backward; then the embedding's backward.
    `before_layer(j)` issues prefetches; `after_bwd(u)` sends unit u's gradients on."""
    b = ctx.b

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    for j in range(ctx.n, 0, -1):
        before_layer(j)
        if j in ctx.taped:
            _taped_backward(ctx, step, micro, j)
            after_bwd(j)
            continue
        (ctx.workspace,) = b.emit(
            oid(j, "recompute"),
            K.RECOMPUTE,
            "gpu",
            step=step,
            unit=j,
            work=ctx.layer_work("recompute"),
            deps=[ctx.weights_ready.get(j), ctx.act_ready.pop(j)],
            acquire=["gpu_workspace"],
            reads=[ctx.weights_read(j), ctx.at(oid(j, "x"), ctx.act_gpu[j])],
            writes=[ctx.taken(oid(j, "tape"), role=Role.TAPE)],
        )
        dx_in = ctx.hidden_grad.pop(j + 1)
        (ctx.hidden_grad[j],) = b.emit(
            oid(j, "bwd"),
            K.BWD,
            "gpu",
            step=step,
            unit=j,
            work=ctx.layer_work("bwd"),
            acquire=["gpu_hidden_grads"],
            release=[ctx.workspace, ctx.act_gpu.pop(j), dx_in],
            reads=[ctx.weights_read(j), ctx.at(oid(j, "tape"), ctx.workspace, role=Role.TAPE),
                   ctx.at(oid(j + 1, "dx"), dx_in)],
            writes=[ctx.grads_write(j, micro), ctx.taken(oid(j, "dx"))],
        )  # fmt: skip
        after_bwd(j)
    dx_in = ctx.hidden_grad.pop(1)
    b.emit(oid(0, "bwd"), K.BWD, "gpu", step=step, unit=0, work=Work(bytes=ctx.hidden_bytes),
           release=[dx_in], reads=[ctx.weights_read(0), ctx.tokens(step, micro),
                                   ctx.at(oid(1, "dx"), dx_in)],
           writes=[ctx.grads_write(0, micro)])  # fmt: skip
    after_bwd(0)


def _taped_backward(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """The backward of a layer whose forward kept its tape: no recompute, no saved input."""
    dx_in, tape = ctx.hidden_grad.pop(j + 1), ctx.tape_slot.pop(j)
    (ctx.hidden_grad[j],) = ctx.b.emit(
        ctx.oid(step, micro, j, "bwd"),
        K.BWD,
        "gpu",
        step=step,
        unit=j,
        work=ctx.layer_work("bwd"),
        deps=[ctx.weights_ready.get(j)],
        acquire=["gpu_hidden_grads"],
        scratch=["gpu_workspace"],
        release=[tape, dx_in],
        reads=[ctx.weights_read(j), ctx.at(ctx.hidden(step, micro, j, "tape"), tape, role=Role.TAPE),
               ctx.at(ctx.hidden(step, micro, j + 1, "dx"), dx_in)],
        writes=[ctx.grads_write(j, micro), ctx.taken(ctx.hidden(step, micro, j, "dx"))],
    )  # fmt: skip


def _save_activation(ctx: Ctx, step: int, micro: int, i: int) -> None:
    """Copy layer i's input to pinned memory (and on to NVMe) once layer i has read it."""
    b, hb = ctx.b, ctx.hidden_bytes

    def oid(w: str) -> str:
        return ctx.oid(step, micro, i, w)

    home = "pinned_acts" if ctx.config.activations == "cpu" else "pinned_act_staging"
    (slot,) = b.emit(
        oid("act.save"),
        K.ACT_SAVE,
        "d2h",
        step=step,
        unit=i,
        work=Work(bytes=hb),
        deps=[oid("fwd")],
        acquire=[home],
        release=[ctx.act_gpu[i]],
        reads=[ctx.at(oid("x"), ctx.act_gpu.pop(i))],
        writes=[ctx.taken(oid("x"))],
    )
    ctx.act_home[i], ctx.act_home_op[i] = slot, oid("act.save")
    ctx.act_ready.pop(i, None)
    if ctx.config.activations == "nvme":
        (disk,) = b.emit(
            oid("act.write"),
            K.NVME_WRITE,
            _drive(ctx, i),
            step=step,
            unit=i,
            work=Work(bytes=hb),
            deps=[oid("act.save")],
            acquire=[act_pool(act_drive(i, ctx.drives))],
            release=[slot],
            reads=[ctx.at(oid("x"), slot)],
            writes=[ctx.taken(oid("x"))],
        )
        ctx.act_home[i], ctx.act_home_op[i] = disk, oid("act.write")


def read_activation(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """NVMe -> pinned staging, one step ahead of the load to the GPU."""
    if ctx.config.activations != "nvme" or not 1 <= j <= ctx.n or j in ctx.act_gpu:
        return
    if j in ctx.taped:
        return
    if not ctx.act_home_op[j].endswith("act.write"):
        return  # already read
    op_id = ctx.oid(step, micro, j, "act.read")
    (staging,) = ctx.b.emit(
        op_id,
        K.NVME_READ,
        _drive(ctx, j),
        step=step,
        unit=j,
        work=Work(bytes=ctx.hidden_bytes),
        deps=[ctx.act_home_op[j]],
        acquire=["pinned_act_staging"],
        release=[ctx.act_home[j]],
        reads=[ctx.at(ctx.hidden(step, micro, j, "x"), ctx.act_home[j])],
        writes=[ctx.taken(ctx.hidden(step, micro, j, "x"))],
    )
    ctx.act_home[j], ctx.act_home_op[j] = staging, op_id


def load_activation(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """Bring layer j's saved input back to the GPU (no-op when it never left or is back)."""
    if ctx.config.activations == "gpu" or not 1 <= j <= ctx.n or j in ctx.act_gpu:
        return
    if j in ctx.taped:
        return
    read_activation(ctx, step, micro, j)
    op_id = ctx.oid(step, micro, j, "act.load")
    (slot,) = ctx.b.emit(
        op_id,
        K.ACT_LOAD,
        "h2d",
        step=step,
        unit=j,
        work=Work(bytes=ctx.hidden_bytes),
        deps=[ctx.act_home_op.pop(j)],
        acquire=["gpu_acts"],
        release=[ctx.act_home[j]],
        reads=[ctx.at(ctx.hidden(step, micro, j, "x"), ctx.act_home.pop(j))],
        writes=[ctx.taken(ctx.hidden(step, micro, j, "x"))],
    )
    ctx.act_gpu[j], ctx.act_ready[j] = slot, op_id


def prefetch_activations(ctx: Ctx, step: int, micro: int, layer: int) -> None:
    """Before layer j's recompute: its input and the next `act_buffers - 2` inputs are loaded
    (the ring keeps one slot free), and one more is read from NVMe into pinned staging."""
    reach = ctx.config.act_buffers - 2
    for j in range(layer, layer - reach - 1, -1):
        load_activation(ctx, step, micro, j)
    read_activation(ctx, step, micro, layer - reach - 1)


def _drive(ctx: Ctx, layer: int) -> str:
    """The lane of the drive that holds a layer's saved input."""
    return f"nvme{act_drive(layer, ctx.drives)}"
