"""Handlers of the `gpu` lane: forward, recompute, backward, the fused loss, device AdamW.

They run inside the lane's stream context (CUDA) or synchronously (CPU mode) and take their
operands from the op's values, in the order `OpKind` documents for the kind:

    FWD        reads (weights, input x)          writes (output x[, tape])
    FWD (0)    reads (weights, fed tokens)       writes (output x, tokens)
    RECOMPUTE  reads (weights, input x)          writes (tape)
    BWD        reads (weights, tape, output dx)  writes (grads, input dx)
    BWD (0)    reads (weights, tokens, dx)       writes (grads)
    LOSS       reads (weights, x, tokens[, tied embedding weights])
               writes (grads, dx[, tied embedding grads], loss[, host loss])
    EVAL_LOSS  reads (weights, x, tokens[, tied embedding weights])   writes (loss, host loss)
    GPU_ADAM   reads (grads, state)              writes (weights, state)

Parameter gradients are accumulated by autograd straight into the unit's gradient buffer: each
parameter leaf gets `.grad` preset to its view of that buffer, and autograd adds in place
(`grad += new`) when grad mode is off, as it is during backward. A gradient written without
`+=` is zeroed first.
"""

from __future__ import annotations

import torch

from executor import adam, layers
from executor.buffers import GpuUnit
from executor.env import Env, LaneState
from executor.tape import Tape
from slide_ir.ir.graph import Op, Role, Value


def _leaves(views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().requires_grad_() for k, v in views.items()}


def _point_grads(leaves: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
    for name, leaf in leaves.items():
        leaf.grad = grads[name]


def _grads(env: Env, v: Value, unit: int) -> GpuUnit:
    """The unit whose gradient `v` is, its gradient zeroed unless `v` accumulates."""
    out = env.buffers.unit_at(v, unit)
    if not v.accumulate:
        out.g.zero_()
    return out


def fwd(env: Env, lane: LaneState, op: Op) -> None:
    u = op.unit
    unit, out = env.buffers.unit_at(op.reads[0], u), env.buffers.of(op.writes[0], u)
    views = env.layouts[u].views(unit.w)
    staged, tape = op.written_as(Role.TOKENS), op.written_as(Role.TAPE)
    with torch.no_grad():
        if staged is not None:  # the embedding: this micro-batch's tokens go up first
            batch = env.take_batch(op.step, op.micro)
            fed = op.read_as(Role.FEED)
            assert fed is not None, f"{op.id}: the embedding's forward reads the staged tokens"
            host, tokens = env.buffers.fed(fed), env.buffers.tokens(staged)
            tokens.ids.copy_(host.ids, non_blocking=True)
            tokens.labels.copy_(host.labels, non_blocking=True)
            if tokens.positions is not None:
                assert host.positions is not None
                tokens.positions.copy_(host.positions, non_blocking=True)
                lane.rope = layers.document_rope(env.spec, tokens.positions, env.dtype)
            host.mark_uploaded()
            tokens.scale = batch.scale
            layers.embed(tokens.ids, views["embed.w"], out)
        elif tape is not None:
            _fwd_taped(env, lane, op, unit, out, tape)
        else:
            x = env.buffers.of(op.reads[1], u)
            layers.decoder_layer(x, views, env.spec, lane.rope_for(env), out=out)


def _fwd_taped(
    env: Env, lane: LaneState, op: Op, unit: GpuUnit, out: torch.Tensor, kept: Value
) -> None:
    """A forward that keeps its tape for `bwd` (the value `kept`): the recompute's work, done
    once; the output goes straight into its slot."""
    u = op.unit
    tape = Tape(weights=unit.w)
    tape.x = env.buffers.of(op.reads[1], u).detach().clone().requires_grad_()
    tape.leaves = _leaves(env.layouts[u].views(unit.w))
    with torch.enable_grad(), tape.hooks():
        tape.root = layers.decoder_layer_taped(
            tape.x, tape.leaves, env.spec, lane.rope_for(env), out=out
        )
    lane.tapes[kept.name] = tape


def recompute(env: Env, lane: LaneState, op: Op) -> None:
    """The layer's forward again from its saved input, keeping the autograd tape for `bwd`
    (without the down projection's output: `layers.decoder_layer_taped`)."""
    u = op.unit
    unit = env.buffers.unit_at(op.reads[0], u)
    tape = Tape(weights=unit.w)
    tape.x = env.buffers.of(op.reads[1], u).detach().requires_grad_()
    tape.leaves = _leaves(env.layouts[u].views(unit.w))
    with torch.enable_grad():
        tape.root = layers.decoder_layer_taped(tape.x, tape.leaves, env.spec, lane.rope_for(env))
    lane.tapes[op.writes[0].name] = tape  # the recompute's one write: the tape


def bwd(env: Env, lane: LaneState, op: Op) -> None:
    u = op.unit
    unit = _grads(env, op.writes[0], u)
    grad_out = env.buffers.of(op.reads[2], u)
    staged = op.read_as(Role.TOKENS)
    if staged is not None:  # the embedding: its gradient is a scatter of the tokens' rows
        ids = env.buffers.tokens(staged).ids
        g = env.layouts[0].views(unit.g)["embed.w"]
        layers.embed_backward(ids, grad_out, g, accumulate=True)
        return
    kept = op.read_as(Role.TAPE)
    assert kept is not None, f"{op.id}: a layer's backward reads its tape"
    name = kept.name
    assert name in lane.tapes, f"{op.id}: no forward or recompute wrote {name}"
    tape = lane.tapes.pop(name)
    assert tape.root is not None and tape.x is not None
    tape.weights = env.buffers.unit_at(op.reads[0], u).w  # where a kept tape's weights are now
    tape.x.grad = env.buffers.of(op.writes[1], u).zero_()
    _point_grads(tape.leaves, env.layouts[u].views(unit.g))
    torch.autograd.backward(tape.root, grad_out, inputs=[tape.x, *tape.leaves.values()])


def _lm_leaf(env: Env, op: Op, head: GpuUnit) -> torch.Tensor:
    """The LM-head weight as a leaf whose gradient lands in its unit's buffer: the head's, or
    with tied embeddings the embedding's (the op's tied read and write)."""
    tied = op.written_as(Role.TIED)
    if tied is not None:
        emb = _grads(env, tied, 0)
        w, g = (env.layouts[0].views(t)["embed.w"] for t in (emb.w, emb.g))
    else:
        layout = env.layouts[env.spec.num_layers + 1]
        w, g = (layout.views(t)["lm.w"] for t in (head.w, head.g))
    leaf = w.detach().requires_grad_()
    leaf.grad = g
    return leaf


def loss(env: Env, lane: LaneState, op: Op) -> None:
    """Final norm + LM head + cross-entropy, forward and backward at once."""
    u = op.unit
    head = _grads(env, op.writes[0], u)
    x = env.buffers.of(op.reads[1], u).detach().requires_grad_()
    x.grad = env.buffers.of(op.writes[1], u).zero_()
    tokens = env.buffers.tokens(op.reads[2])
    layout = env.layouts[u]
    norm = layout.views(head.w)["norm"].detach().requires_grad_()
    norm.grad = layout.views(head.g)["norm"]
    lm = _lm_leaf(env, op, head)
    with torch.enable_grad():
        value = layers.head_loss(
            x,
            norm,
            lm,
            tokens.labels,
            eps=env.spec.rms_norm_eps,
            scale=tokens.scale,
            chunk=env.lce_chunk,
        )
    value.backward(inputs=[x, norm, lm])
    _record_loss(env, op, value.detach())


def _record_loss(env: Env, op: Op, value: torch.Tensor) -> None:
    """Into the step's loss (added to it after the step's first micro-batch), and at its last
    micro-batch into the host copy the driver reports."""
    loss, host = op.written_as(Role.LOSS), op.written_as(Role.HOST_LOSS)
    assert loss is not None, f"{op.id}: a loss op writes the step's loss"
    total = env.buffers.tensor(loss.slot)
    if loss.accumulate:
        total += value
    else:
        total.copy_(value)
    if host is not None:
        env.buffers.tensor(host.slot).copy_(total, non_blocking=True)


def eval_loss(env: Env, lane: LaneState, op: Op) -> None:
    """An eval batch's head forward alone: its summed token loss (the staged scale is 1) into
    the batch's loss slot, no gradient anywhere."""
    u = op.unit
    head = env.buffers.unit_at(op.reads[0], u)
    tokens = env.buffers.tokens(op.reads[2])
    tied = op.read_as(Role.TIED)
    if tied is not None:
        lm = env.layouts[0].views(env.buffers.unit_at(tied, 0).w)["embed.w"]
    else:
        lm = env.layouts[u].views(head.w)["lm.w"]
    with torch.no_grad():
        value = layers.head_loss(
            env.buffers.of(op.reads[1], u),
            env.layouts[u].views(head.w)["norm"],
            lm,
            tokens.labels,
            eps=env.spec.rms_norm_eps,
            scale=tokens.scale,
            chunk=env.lce_chunk,
        )
    _record_loss(env, op, value)


def gpu_adam(env: Env, lane: LaneState, op: Op) -> None:
    """A resident unit's AdamW (state in its resident slot), or a streamed one's (state in the
    slot it was uploaded to)."""
    u = op.unit
    runs, scale = env.update_scale(op)
    if not runs:
        return
    unit, shard = env.buffers.unit_at(op.reads[0], u), env.shards[u]
    state = env.opt_state(op.reads[1], u)
    w, g = (t[shard.start : shard.end] for t in (unit.w, unit.g))
    adam.update_device(shard, w, g, state, env.hp(op.step, lane.lane, scale), env.step_t)
