"""The handler table: one function per `OpKind` (a test asserts it covers the vocabulary).

Compute handlers live in `compute`; the copies, host optimizer ops and NVMe I/O are here. Each
takes its operands from the op's values (a copy reads its source, writes its destination).
Copies are `non_blocking` on the lane's stream (CUDA) and plain synchronous copies in CPU mode.

    H2D_PARAM, W_D2H, D2H_GRAD, ACT_SAVE, ACT_LOAD   reads (src)  writes (dst)
    CAST       reads (master, or its stripes read from NVMe)   writes (compute-dtype weights: a
               pinned copy or ring slot)
    OPT_H2D    reads (master, moments)  writes (state)
    OPT_D2H    reads (state)            writes (master, moments)
    GRAD_ACCUM reads (landed grads)     writes (accumulator, += after the first micro-batch)
    ADAM       by role: landed grads, the accumulator, state in RAM or NVMe staging stripes,
               global clipping's scale; writes the state it read (and the pinned weights,
               where the unit's uploads are not cast; a speculative one the rollback copy)
    REDO       by role: landed grads or the accumulator, the scale, the rollback copy; writes
               the state (and the pinned weights) back when the step clips or is skipped
    GRAD_NORM, NORM   global clipping (`clipping`)
    NVME_READ / NVME_WRITE   reads (src)  writes (dst): activations, a state stripe, a held
               gradient (global clipping), or a stripe's master part for a cast
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from executor import adam, clipping, compute
from executor.buffers import OptState, stripe_numel
from executor.env import Env, LaneState
from slide_ir.ir.graph import Graph, Op, OpKind, PoolRole, Value
from slide_ir.ir.vocab import lane_index

Handler = Callable[[Env, LaneState, Op], None]
R = PoolRole


def _src_dst(env: Env, op: Op) -> tuple[torch.Tensor, torch.Tensor]:
    return env.buffers.of(op.reads[0], op.unit), env.buffers.of(op.writes[0], op.unit)


# -- transfers (h2d / d2h lanes; ZeRO-offload's gradient flushes on gpu) ----------------------
# Host copies hold the rank's shard of a unit (all of it on one rank): the transfers move the
# shard's range of the unit's GPU buffer.
def _on_gpu(env: Env, t: torch.Tensor, unit: int) -> torch.Tensor:
    shard = env.shards[unit]
    return t[shard.start : shard.end]


def _on_host(env: Env, v: Value, unit: int) -> torch.Tensor:
    return env.buffers.of(v, unit)[: env.shards[unit].numel]


def h2d_param(env: Env, lane: LaneState, op: Op) -> None:
    dst = _on_gpu(env, env.buffers.unit_at(op.writes[0], op.unit).w, op.unit)
    dst.copy_(_on_host(env, op.reads[0], op.unit), non_blocking=True)


def d2h_grad(env: Env, lane: LaneState, op: Op) -> None:
    src = _on_gpu(env, env.buffers.unit_at(op.reads[0], op.unit).g, op.unit)
    _on_host(env, op.writes[0], op.unit).copy_(src, non_blocking=True)


def w_d2h(env: Env, lane: LaneState, op: Op) -> None:
    """A streamed unit's updated weights into the pinned copy the next upload reads."""
    src = _on_gpu(env, env.buffers.unit_at(op.reads[0], op.unit).w, op.unit)
    _on_host(env, op.writes[0], op.unit).copy_(src, non_blocking=True)


def _host_state(env: Env, master: Value, moments: Value, unit: int) -> OptState:
    numel = env.shards[unit].numel
    both = env.buffers.of(moments, unit)
    return OptState(master=env.buffers.of(master, unit), m=both[:numel], v=both[numel:])


def opt_h2d(env: Env, lane: LaneState, op: Op) -> None:
    """A streamed unit's FP32 master and moments from pinned RAM into its GPU slot."""
    host = _host_state(env, *op.reads, op.unit)
    _copy_state(env.opt_state(op.writes[0], op.unit), host)


def opt_d2h(env: Env, lane: LaneState, op: Op) -> None:
    host = _host_state(env, *op.writes, op.unit)
    _copy_state(host, env.opt_state(op.reads[0], op.unit))


def _copy_state(dst: OptState, src: OptState) -> None:
    for d, s in zip((dst.master, dst.m, dst.v), (src.master, src.m, src.v), strict=True):
        d.copy_(s, non_blocking=True)


def copy(env: Env, lane: LaneState, op: Op) -> None:
    """ACT_SAVE (device -> pinned, d2h lane), ACT_LOAD (pinned -> device, h2d lane)."""
    src, dst = _src_dst(env, op)
    dst.copy_(src, non_blocking=True)


def cast(env: Env, lane: LaneState, op: Op) -> None:
    """The rank's shard of a unit's FP32 master into compute-dtype weights (its pinned copy, or
    a weight-ring slot sized for the largest unit), on the cpu lane's threads. The master is
    one tensor in RAM, or one stripe per drive read from NVMe (element ranges, in order)."""
    dst = _on_host(env, op.writes[0], op.unit)
    stripes = _role(env, op.reads, R.MASTER_STAGING)
    if not stripes:
        dst.copy_(env.buffers.of(op.reads[0], op.unit))
        return
    assert env.nvme is not None
    per = stripe_numel(dst.numel(), env.nvme.drives)
    for k, v in enumerate(stripes):
        part = dst[k * per : (k + 1) * per]
        part.copy_(env.buffers.of(v, op.unit)[: part.numel()])


# -- host optimizer (cpu lane) -----------------------------------------------------------------
def grad_accum(env: Env, lane: LaneState, op: Op) -> None:
    # the landing slot may be larger than the unit (the embedding's and head's shared one)
    grad, acc = _on_host(env, op.reads[0], op.unit), env.buffers.of(op.writes[0], op.unit)
    if op.writes[0].accumulate:
        acc.add_(grad)
    else:
        acc.copy_(grad)


def _role(env: Env, values: tuple[Value, ...], role: PoolRole) -> list[Value]:
    return [v for v in values if env.buffers.roles[v.slot] == role]


def adam_host(env: Env, lane: LaneState, op: Op) -> None:
    """AdamW of one unit on the host; the last micro-batch's gradients are added to the
    accumulator first when the step has several."""
    u = op.unit
    runs, scale = env.update_scale(op)
    if not runs:
        return
    landed = _role(env, op.reads, R.GRAD_LANDING)
    accumulators = _role(env, op.reads, R.GRAD_ACCUM)
    if landed:
        grad = _on_host(env, landed[0], u)
        for acc in accumulators:
            grad = env.buffers.of(acc, u).add_(grad)
    else:  # global clipping's GRAD_NORM added the last micro-batch already
        grad = _on_host(env, accumulators[0], u)
    assert lane.scratch is not None, "the cpu lane owns the optimizer scratch"
    staging = tuple(v.slot for v in _role(env, op.reads, R.OPT_STAGING))
    parts = env.host_parts(u, staging)
    copies = _role(env, op.writes, R.HOST_WEIGHTS)  # none where the uploads cast
    dst = env.buffers.of(copies[0], u) if copies else None
    rollback = _role(env, op.writes, R.ROLLBACK)  # a speculative update saves the state first
    saved = env.buffers.state_at(rollback[0], u) if rollback else None
    hp = env.hp(op.step, lane.lane, scale)
    adam.update_host(env.shards[u], grad, parts, dst, hp, lane.scratch, saved)


def redo(env: Env, lane: LaneState, op: Op) -> None:
    """Global clipping's validation of a speculative update: the state restored from its
    rollback copy when the step is skipped or clipped, and in a clipped one updated again from
    there with the scale; nothing when the scale is 1 (the speculation was the update)."""
    u = op.unit
    runs, scale = env.update_scale(op)
    if runs and scale == 1.0:
        return
    (saved,) = _role(env, op.reads, R.ROLLBACK)
    state = env.host_state(u)
    adam.restore(state, env.buffers.state_at(saved, u))
    copies = _role(env, op.writes, R.HOST_WEIGHTS)
    dst = env.buffers.of(copies[0], u) if copies else None
    if not runs:  # skipped: the state as it was, and the weights the next upload reads
        if dst is not None:
            dst.copy_(state.master)
        return
    landed = _role(env, op.reads, R.GRAD_LANDING) or _role(env, op.reads, R.GRAD_ACCUM)
    grad = _on_host(env, landed[0], u)
    assert lane.scratch is not None, "the cpu lane owns the optimizer scratch"
    parts = env.host_parts(u, ())
    adam.update_host(env.shards[u], grad, parts, dst, env.hp(op.step, lane.lane, scale),
                     lane.scratch)  # fmt: skip


# -- NVMe lanes ----------------------------------------------------------------------------------
def _nvme_offset(env: Env, v: Value, unit: int) -> int:
    """Byte offset in its drive's file of NVMe value `v`: an activation slot's, the unit's
    held gradient, or its optimizer-state stripe."""
    assert env.nvme is not None
    role = env.buffers.roles[v.slot]
    if role == R.NVME_HIDDEN:
        return env.nvme.act_offset(env.buffers.index[v.slot], env.act_bytes)
    if role == R.NVME_GRADS:
        return env.nvme.grad_offset[unit]
    return env.nvme.offset[unit]


def nvme_write(env: Env, lane: LaneState, op: Op) -> None:
    assert env.nvme is not None
    offset = _nvme_offset(env, op.writes[0], op.unit)
    env.nvme.write(lane_index(op.lane), offset, _staged(env, op.reads[0], op.unit))


def nvme_read(env: Env, lane: LaneState, op: Op) -> None:
    """A stripe of a unit's optimizer state, an activation slot, or (into `MASTER_STAGING`, for
    a cast) the master part that leads the unit's stripe."""
    assert env.nvme is not None
    offset = _nvme_offset(env, op.reads[0], op.unit)
    env.nvme.read(lane_index(op.lane), offset, _staged(env, op.writes[0], op.unit))


def _staged(env: Env, v: Value, unit: int) -> torch.Tensor:
    """The host side of an NVMe transfer of `unit`: its slot, cut to the unit's stripe where
    the slot is sized for a larger unit (the embedding's and the head's shared staging, a
    master slot sized for the largest unit), so no transfer runs past the unit's region."""
    assert env.nvme is not None
    t, role, numel = env.buffers.of(v, unit), env.buffers.roles[v.slot], env.shards[unit].numel
    if role == R.MASTER_STAGING:
        return t[: stripe_numel(numel, env.nvme.drives)]
    if role == R.OPT_STAGING:
        assert env.stripes is not None
        return t[: env.stripes.stripe_bytes(numel)]
    if role == R.GRAD_LANDING:  # a held gradient, to or from its drive
        return t[:numel]
    return t


# -- net lane (data parallel) -------------------------------------------------------------------
def reduce_scatter(env: Env, lane: LaneState, op: Op) -> None:
    """A unit's gradient summed over the ranks: this rank's shard of it, in place."""
    assert env.ranks is not None, op.id
    g = env.buffers.unit_at(op.reads[0], op.unit).g
    env.ranks.reduce_scatter(g, env.layouts[op.unit].numel)


def all_gather(env: Env, lane: LaneState, op: Op) -> None:
    """A unit's weights whole on every rank from the shards each uploaded or updated."""
    assert env.ranks is not None, op.id
    w = env.buffers.unit_at(op.writes[0], op.unit).w
    env.ranks.all_gather(w, env.layouts[op.unit].numel)


HANDLERS: dict[OpKind, Handler] = {
    OpKind.FWD: compute.fwd,
    OpKind.RECOMPUTE: compute.recompute,
    OpKind.BWD: compute.bwd,
    OpKind.LOSS: compute.loss,
    OpKind.EVAL_LOSS: compute.eval_loss,
    OpKind.H2D_PARAM: h2d_param,
    OpKind.D2H_GRAD: d2h_grad,
    OpKind.ADAM: adam_host,
    OpKind.REDO: redo,
    OpKind.GPU_ADAM: compute.gpu_adam,
    OpKind.OPT_H2D: opt_h2d,
    OpKind.OPT_D2H: opt_d2h,
    OpKind.W_D2H: w_d2h,
    OpKind.CAST: cast,
    OpKind.GRAD_ACCUM: grad_accum,
    OpKind.GRAD_NORM: clipping.grad_norm,
    OpKind.NORM: clipping.norm,
    OpKind.ACT_SAVE: copy,
    OpKind.ACT_LOAD: copy,
    OpKind.NVME_READ: nvme_read,
    OpKind.NVME_WRITE: nvme_write,
    OpKind.REDUCE_SCATTER: reduce_scatter,
    OpKind.ALL_GATHER: all_gather,
}


class UnsupportedOpError(ValueError):
    """A graph holds an op kind this executor has no handler for."""


def lower(graph: Graph) -> dict[str, Handler]:
    """Each op's handler, looked up once, before anything runs: an op kind only the layout
    planner's cluster graphs hold (tensor- and pipeline-parallel collectives, which the
    simulator prices) is refused here, naming it, not at its turn in the run."""
    missing = sorted({op.kind for op in graph.ops} - HANDLERS.keys())
    if missing:
        raise UnsupportedOpError(
            f"the executor runs no {', '.join(missing)} op: the graph is one the simulator "
            "can time but this executor cannot run (it runs single-GPU and data-parallel plans)"
        )
    return {op.id: HANDLERS[op.kind] for op in graph.ops}
