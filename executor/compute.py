"""Handlers of the `gpu` lane: forward, recompute, backward, the fused loss, device AdamW.

They run inside the lane's stream context (CUDA) or synchronously (CPU mode). Parameter
gradients are accumulated by autograd straight into the unit's gradient buffer: each parameter
leaf gets `.grad` preset to its view of that buffer, and autograd adds in place (`grad += new`)
when grad mode is off, as it is during backward. Overwrite mode zeroes the buffer first.
"""

from __future__ import annotations

import torch

from executor import adam, layers
from executor.binding import Bind
from executor.buffers import GpuUnit, OptState
from executor.env import Env, LaneState
from slide_ir.graph import Op


def _leaves(views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().requires_grad_() for k, v in views.items()}


def _point_grads(leaves: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
    for name, leaf in leaves.items():
        leaf.grad = grads[name]


def _unit(env: Env, key: str) -> GpuUnit:
    return env.buffers.gpu_unit(key)


def fwd(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    unit, out = _unit(env, b.weights), env.buffers.tensor(b.x_out)
    views = env.layouts[op.unit].views(unit.w)
    with torch.no_grad():
        if op.unit == 0:
            lane.batch = env.take_batch(op.step, b.micro)
            env.tokens.ids.copy_(lane.batch.ids, non_blocking=True)
            env.tokens.labels.copy_(lane.batch.labels, non_blocking=True)
            layers.embed(env.tokens.ids, views["embed.w"], out)
        else:
            x = env.buffers.tensor(b.x_in)
            layers.decoder_layer(x, views, env.spec, env.rope, out=out)


def recompute(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    """The layer's forward again from its saved input, keeping the autograd tape for `bwd`."""
    unit = _unit(env, b.weights)
    x = env.buffers.tensor(b.x_in).detach().requires_grad_()
    leaves = _leaves(env.layouts[op.unit].views(unit.w))
    with torch.enable_grad():
        out = layers.decoder_layer(x, leaves, env.spec, env.rope)
    lane.work = (out, x, leaves)


def bwd(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    unit = _unit(env, b.weights)
    if not b.accumulate:
        unit.g.zero_()
    grad_out = env.buffers.tensor(b.hg_in)
    if op.unit == 0:
        assert lane.batch is not None
        g = env.layouts[0].views(unit.g)["embed.w"]
        layers.embed_backward(env.tokens.ids, grad_out, g, accumulate=True)
        return
    assert lane.work is not None, f"{op.id}: no recompute before this backward"
    (out, x, leaves), lane.work = lane.work, None
    x.grad = env.buffers.tensor(b.hg_out).zero_()
    _point_grads(leaves, env.layouts[op.unit].views(unit.g))
    torch.autograd.backward(out, grad_out, inputs=[x, *leaves.values()])


def _lm_leaf(env: Env, b: Bind, head: GpuUnit) -> torch.Tensor:
    """The LM-head weight as a leaf whose gradient lands in its unit's buffer."""
    if b.embed:
        emb = _unit(env, b.embed)
        if not b.accumulate_embed:
            emb.g.zero_()
        w, g = (env.layouts[0].views(t)["embed.w"] for t in (emb.w, emb.g))
    else:
        layout = env.layouts[env.spec.num_layers + 1]
        w, g = (layout.views(t)["lm.w"] for t in (head.w, head.g))
    leaf = w.detach().requires_grad_()
    leaf.grad = g
    return leaf


def loss(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    """Final norm + LM head + cross-entropy, forward and backward at once."""
    assert lane.batch is not None
    head = _unit(env, b.weights)
    if not b.accumulate:
        head.g.zero_()
    x = env.buffers.tensor(b.x_in).detach().requires_grad_()
    x.grad = env.buffers.tensor(b.hg_out).zero_()
    layout = env.layouts[op.unit]
    norm = layout.views(head.w)["norm"].detach().requires_grad_()
    norm.grad = layout.views(head.g)["norm"]
    lm = _lm_leaf(env, b, head)
    with torch.enable_grad():
        value = layers.head_loss(
            x,
            norm,
            lm,
            env.tokens.labels,
            eps=env.spec.rms_norm_eps,
            scale=lane.batch.scale,
            chunk=env.lce_chunk,
        )
    value.backward(inputs=[x, norm, lm])
    total = env.loss_dev[op.step - 1]
    total += value.detach()
    if b.last_micro:
        env.loss_host[op.step - 1].copy_(total, non_blocking=True)


def gpu_adam(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    """A resident unit's AdamW (state in `devopt.u`), or a streamed one's (state in the staging
    slot `b.src`, its FP32 gradient upcast into the slot's scratch)."""
    unit, layout = _unit(env, b.weights), env.layouts[op.unit]
    grad32 = None
    if b.src:
        state = env.stream_state(b.src, op.unit)
        grad32 = env.buffers.tensor(f"{b.src}.grad")[: layout.numel]
    else:
        state = env.buffers[f"devopt.{op.unit}"]
        assert isinstance(state, OptState)
    adam.update_device(layout, unit.w, unit.g, state, env.hp(op.step), env.step_t, grad32)
