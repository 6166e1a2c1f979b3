"""What handlers see: the run's shared, set-up-once environment, and each lane's own state.

`Env` is built before the lanes start and not rebound afterwards: its tensors are written only
by ops, in the order the graph's dependencies allow. `LaneState` belongs to one lane thread
(its stream, the autograd tapes a recompute leaves for its backward, keyed by the tape's value
name, optimizer scratch) and is never touched by another thread.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from executor.adam import AdamWConfig, HostScratch, Part, StepHp
from executor.buffers import Buffers, OptState
from executor.completion import Aborted
from executor.layers import Rope
from executor.layout import Shard, UnitLayout
from executor.nvme import NvmeStore, StripeFormat
from executor.ranks import Ranks
from executor.staging import TokenStaging
from executor.tape import Tape
from slide_ir.ir.graph import Op, PoolRole, Value
from slide_ir.specs.model import ModelSpec

_POLL_S = 0.05


@dataclass(frozen=True, kw_only=True, slots=True)
class MicroBatch:
    step: int
    micro: int
    scale: float  # 1 / labelled tokens of the whole step: micro-batch losses sum to its mean


@dataclass(kw_only=True)
class Env:
    spec: ModelSpec
    layouts: dict[int, UnitLayout]
    shards: dict[int, Shard]  # what this rank updates of each unit (all of it on one rank)
    buffers: Buffers
    rope: Rope | None  # None: packed documents, each micro-batch's in the gpu lane's state
    device: torch.device
    dtype: torch.dtype
    cuda: bool
    optim: AdamWConfig
    step_offset: int  # optimizer steps done before this run (resume)
    total_steps: int  # horizon of the lr schedule
    lce_chunk: int | None
    step_t: torch.Tensor  # device step counter for the fused device AdamW
    abort: threading.Event
    act_bytes: int  # bytes of one saved layer input (its pool's slot shape, compute dtype)
    moments_bf16: bool = False
    clip_norm: float | None = None  # per-unit gradient clipping, from the plan's TrainConfig
    global_clip_norm: float = 0.0  # global clipping's max norm (`clipping`; 0: none)
    skipped: set[int] = field(default_factory=set)  # global steps a non-finite norm skipped
    grad_norms: dict[int, float] = field(default_factory=dict)  # global step -> its norm
    # global steps whose norm clipped or was not finite: where speculated updates rolled back
    clipped: set[int] = field(default_factory=set)
    staging: TokenStaging  # the host token slots the main thread stages micro-batches in
    batches: queue.Queue[MicroBatch] = field(default_factory=queue.Queue)
    nvme: NvmeStore | None = None
    stripes: StripeFormat | None = None
    ranks: Ranks | None = None  # data parallel: this process's rank and groups

    def hp(self, step: int, lane: str, grad_scale: float | None = None) -> StepHp:
        """The update's hyperparameters; a shard's clipping sums its norm on `lane`'s group.
        The bias correction counts the updates made: skipped steps made none."""
        global_step = self.step_offset + step
        ranks = self.ranks
        return StepHp(
            step=global_step - sum(1 for s in self.skipped if s < global_step),
            lr=self.optim.lr_at(global_step, self.total_steps),
            config=self.optim,
            clip_norm=self.clip_norm,
            sum_over_ranks=(lambda t: ranks.sum_(t, lane)) if ranks is not None else None,
            grad_scale=grad_scale,
        )

    def update_scale(self, op: Op) -> tuple[bool, float | None]:
        """(whether `op`, an update, runs; the gradient scale it applies): under global
        clipping the scale `NORM` wrote, and no update in a step it skipped."""
        scales = [v for v in op.reads if self.buffers.roles[v.slot] == PoolRole.GRAD_SCALE]
        if not scales:
            return True, None
        if self.step_offset + op.step in self.skipped:
            return False, None
        return True, float(self.buffers.of(scales[0], op.unit)[0])

    def take_batch(self, step: int, micro: int) -> MicroBatch:
        """The next micro-batch from the main thread; it must be the one the op expects."""
        while True:
            try:
                mb = self.batches.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if self.abort.is_set():
                    raise Aborted from None
        if (mb.step, mb.micro) != (step, micro):
            raise RuntimeError(f"expected micro-batch {micro} of step {step}, got {mb}")
        return mb

    def host_state(self, unit: int) -> OptState:
        """A unit's FP32 master and moments in host RAM (this rank's shard of them)."""
        numel = self.shards[unit].numel
        moments = self.buffers.tensor(f"moments.{unit}")
        master = self.buffers.tensor(f"master.{unit}")
        return OptState(master=master, m=moments[:numel], v=moments[numel:])

    def opt_state(self, v: Value, unit: int) -> OptState:
        """A unit's FP32 master and moments on the GPU (value `L3.state`): in its resident
        slot, or in the streamed-state slot it was uploaded to (sized to the pool's largest)."""
        if self.buffers.roles[v.slot] == PoolRole.RESIDENT:
            state = self.buffers[f"devopt.{unit}"]
            assert isinstance(state, OptState), unit
            return state
        numel = self.shards[unit].numel
        state = self.buffers[v.slot]
        assert isinstance(state, OptState), v
        return OptState(master=state.master[:numel], m=state.m[:numel], v=state.v[:numel])

    def host_parts(self, unit: int, staging: tuple[str, ...]) -> list[Part]:
        """Where a host-updated unit's optimizer state is for this update: RAM, or the NVMe
        stripes just read into `staging` (master from RAM when only moments are on NVMe)."""
        numel = self.shards[unit].numel
        master = self.buffers.items.get(f"master.{unit}")
        assert master is None or isinstance(master, torch.Tensor)
        if not staging:
            return [Part(lo=0, hi=numel, state=self.host_state(unit))]
        assert self.stripes is not None
        return [
            self.stripes.part(self.buffers.tensor(slot), numel, k, master)
            for k, slot in enumerate(staging)
        ]


@dataclass(kw_only=True)
class LaneState:
    lane: str
    stream: Any = None  # torch.cuda.Stream on CUDA, None in CPU mode and on host lanes
    # recompute or kept forward -> backward: tape value name -> its `Tape`
    tapes: dict[str, Tape] = field(default_factory=dict)
    scratch: HostScratch | None = None
    # packed documents: the RoPE tables and mask of the micro-batch in flight, built by its
    # embedding's forward. Every layer op of a micro-batch (forward, recompute, backward) runs
    # on the gpu lane between that forward and the next micro-batch's, which rebuilds them.
    rope: Rope | None = None

    def rope_for(self, env: Env) -> Rope:
        """The tables and mask a decoder layer of the micro-batch in flight uses."""
        rope = env.rope if env.rope is not None else self.rope
        assert rope is not None, "packed documents: a layer ran before its embedding's forward"
        return rope
