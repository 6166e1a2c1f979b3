"""The handler table: one function per `OpKind` (a test asserts it covers the vocabulary).

Compute handlers live in `compute`; the copies, host optimizer ops and NVMe I/O are here. Copies
are `non_blocking` on the lane's stream (CUDA) and plain synchronous copies in CPU mode.
"""

from __future__ import annotations

from collections.abc import Callable

from executor import adam, compute
from executor.binding import Bind
from executor.buffers import OptState
from executor.env import Env, LaneState
from slide_ir.graph import Op, OpKind, slot_pool

Handler = Callable[[Env, LaneState, Op, Bind], None]


# -- transfers (h2d / d2h lanes) ---------------------------------------------------------------
def h2d_param(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    env.buffers.gpu_unit(b.dst).w.copy_(env.buffers.tensor(b.src), non_blocking=True)


def d2h_grad(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    env.buffers.tensor(b.dst).copy_(env.buffers.gpu_unit(b.src).g, non_blocking=True)


def w_d2h(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    """A streamed unit's updated weights into the pinned copy the next upload reads."""
    env.buffers.tensor(b.dst).copy_(env.buffers.gpu_unit(b.src).w, non_blocking=True)


def opt_h2d(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    """A streamed unit's FP32 master and moments from pinned RAM into its GPU slot."""
    _copy_state(env.stream_state(b.dst, op.unit), env.host_state(op.unit))


def opt_d2h(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    _copy_state(env.host_state(op.unit), env.stream_state(b.src, op.unit))


def _copy_state(dst: OptState, src: OptState) -> None:
    for d, s in zip((dst.master, dst.m, dst.v), (src.master, src.m, src.v), strict=True):
        d.copy_(s, non_blocking=True)


def copy_activation(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    """ACT_SAVE (device -> pinned, d2h lane) and ACT_LOAD (pinned -> device, h2d lane)."""
    env.buffers.tensor(b.dst).copy_(env.buffers.tensor(b.src), non_blocking=True)


# -- host optimizer (cpu lane) -----------------------------------------------------------------
def grad_accum(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    acc, grad = env.buffers.tensor(b.dst), env.buffers.tensor(b.src)
    if b.first:
        acc.copy_(grad)
    else:
        acc.add_(grad)


def adam_host(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    """AdamW of one unit on the host; the last micro-batch's gradients are added to the
    accumulator first when the step has several."""
    grad = env.buffers.tensor(b.src)
    if b.accum:
        grad = env.buffers.tensor(b.accum).add_(grad)
    assert lane.scratch is not None, "the cpu lane owns the optimizer scratch"
    parts = env.host_parts(op.unit, b.staging)
    layout = env.layouts[op.unit]
    adam.update_host(layout, grad, parts, env.buffers.tensor(b.dst), env.hp(op.step), lane.scratch)


def cast(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    env.buffers.tensor(b.dst).copy_(env.buffers.tensor(b.src))


# -- NVMe lanes ----------------------------------------------------------------------------------
def _act_offset(env: Env, slot: str) -> int:
    """Byte offset of NVMe activation slot `nvme_acts.j` in its drive's file."""
    assert env.nvme is not None
    return env.nvme.act_offset(int(slot.rpartition(".")[2]), env.act_bytes)


def nvme_write(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    assert env.nvme is not None
    src = env.buffers.tensor(b.src)
    if slot_pool(b.src).startswith("opt_staging_"):
        env.nvme.write(b.drive, env.nvme.offset[op.unit], src)
    else:
        env.nvme.write(b.drive, _act_offset(env, b.dst), src)


def nvme_read(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    assert env.nvme is not None
    dst = env.buffers.tensor(b.dst)
    if slot_pool(b.dst).startswith("opt_staging_"):
        env.nvme.read(b.drive, env.nvme.offset[op.unit], dst)
    else:
        env.nvme.read(b.drive, _act_offset(env, b.src), dst)


def collective(env: Env, lane: LaneState, op: Op, b: Bind) -> None:
    raise NotImplementedError(
        f"op {op.id}: {op.kind} is simulated only (multi-GPU layouts are planned on paper)"
    )


HANDLERS: dict[OpKind, Handler] = {
    OpKind.FWD: compute.fwd,
    OpKind.RECOMPUTE: compute.recompute,
    OpKind.BWD: compute.bwd,
    OpKind.LOSS: compute.loss,
    OpKind.H2D_PARAM: h2d_param,
    OpKind.D2H_GRAD: d2h_grad,
    OpKind.ADAM: adam_host,
    OpKind.GPU_ADAM: compute.gpu_adam,
    OpKind.OPT_H2D: opt_h2d,
    OpKind.OPT_D2H: opt_d2h,
    OpKind.W_D2H: w_d2h,
    OpKind.CAST: cast,
    OpKind.GRAD_ACCUM: grad_accum,
    OpKind.ACT_SAVE: copy_activation,
    OpKind.ACT_LOAD: copy_activation,
    OpKind.NVME_READ: nvme_read,
    OpKind.NVME_WRITE: nvme_write,
    OpKind.ALL_REDUCE: collective,
    OpKind.REDUCE_SCATTER: collective,
    OpKind.ALL_GATHER: collective,
    OpKind.ALL_TO_ALL: collective,
    OpKind.SEND_RECV: collective,
}
