"""AdamW: hyperparameters, the learning-rate schedule, and the update of one unit.

Host units are updated by the `cpu` lane with the single-pass kernel of `host_adam` (gradient,
master and moments read once, master, moments and the pinned compute-dtype copy written once;
vectorised, parallel over the intra-op threads, GIL released). Where that kernel cannot be
built (logged once), `update_host_torch` does the same with torch's fused CPU AdamW
(`torch._fused_adamw_`) in chunks of `CHUNK` elements: per chunk the gradient is upcast to FP32
(scratch), master and moments are updated, and the new master is cast into the copy while the
chunk is still in cache. The two agree bit for bit but for the last bit of v at the few
elements torch's scalar tail handles. Device units (resident, streamed, gpu-only) get one pass
of the Triton AdamW on CUDA (`update_device`).

Semantics equal `torch.optim.AdamW`: decoupled weight decay (`p -= lr * wd * p`), bias
correction with the optimizer step count, no decay for 1-D parameters (norms, biases).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

import slide_kernels
from executor import fused, host_adam
from executor.buffers import OptState

SCHEDULES = ("constant", "cosine", "linear")
CHUNK = 1 << 20  # elements per fused step on the host: ~18 MB of working set, cache-sized
WHOLE = 1 << 62  # the kernel's "chunk": one call per decay group x state part


@dataclass(frozen=True, kw_only=True, slots=True)
class AdamWConfig:
    lr: float = 1e-5
    schedule: str = "constant"  # constant | cosine | linear
    warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    total_steps: int | None = None  # horizon of the decay; None: the run's steps

    def __post_init__(self) -> None:
        if not self.lr >= 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not all(0.0 <= b < 1.0 for b in self.betas) or len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.total_steps is not None and self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")

    def lr_at(self, step: int, total: int) -> float:
        """Learning rate of optimizer step `step` (1-based) of `total`.

        Warmup: lr * step / warmup_steps for step <= warmup_steps. Then constant, or a linear /
        cosine decay from lr at step warmup_steps + 1 towards 0 after step `total`.
        """
        if step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        span = max(1, total - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps - 1) / span)
        if self.schedule == "linear":
            return self.lr * (1.0 - progress)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class Ranges(Protocol):
    """What an update asks of the elements it updates: a unit's `UnitLayout`, or a rank's
    `Shard` of it."""

    def decay_ranges(self) -> tuple[tuple[int, int, bool], ...]: ...


# a 0-d FP32 tensor summed over the ranks (data parallel: a unit's squared norm over its shards)
SumOverRanks = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepHp:
    """What one update needs beyond the buffers."""

    step: int  # optimizer step count (bias correction)
    lr: float
    config: AdamWConfig
    clip_norm: float | None = None  # per-unit gradient clipping (TrainConfig.clip == "per-unit")
    sum_over_ranks: SumOverRanks | None = None  # the gradient is a shard: its norm is the sum's
    grad_scale: float | None = None  # global clipping's scale, from the step's `NORM`


CLIP_EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_


def fp32_norm(t: torch.Tensor) -> torch.Tensor:
    """||t|| as a 0-d FP32 tensor: torch's norm, except for a host tensor in BF16 or FP16 (a
    landed gradient), whose squares the host kernel sums in double at memory speed (torch's CPU
    norm of BF16 ran at 2.3 GB/s: as long as the AdamW pass itself)."""
    if not t.is_cuda and t.dtype != torch.float32 and (total := host_adam.sumsq(t)) is not None:
        return torch.tensor(math.sqrt(total), dtype=torch.float32)
    return torch.linalg.vector_norm(t, dtype=torch.float32)


def clip_coef(
    grad: torch.Tensor,
    max_norm: float | None,
    sum_over_ranks: SumOverRanks | None = None,
) -> torch.Tensor | None:
    """min(1, max_norm / (||grad|| + eps)) as a 0-d FP32 tensor on the grad's device (no host
    sync on a GPU), or None when not clipping. A shard's norm is the unit's: its squares
    summed over the ranks."""
    if max_norm is None:
        return None
    norm = fp32_norm(grad)
    if sum_over_ranks is not None:
        norm = sum_over_ranks(norm.square()).sqrt()
    return (max_norm / (norm + CLIP_EPS)).clamp(max=1.0)


class HostScratch:
    """FP32 scratch of one chunk for the `cpu` lane (allocated once, lane-local). Made at set-up,
    so it also builds or loads the host kernel there: the first step never pays the compile."""

    def __init__(self, bf16_moments: bool) -> None:
        host_adam.kernel()
        self.grad = torch.empty(CHUNK)
        self.m = torch.empty(CHUNK) if bf16_moments else None
        self.v = torch.empty(CHUNK) if bf16_moments else None
        self.step = torch.zeros(())


@dataclass(frozen=True, kw_only=True, slots=True)
class Part:
    """A range [lo, hi) of a unit's elements and the state tensors covering exactly it."""

    lo: int
    hi: int
    state: OptState


def _fused(
    master: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    step_t: torch.Tensor,
    hp: StepHp,
    decay: bool,
) -> None:
    c = hp.config
    torch._fused_adamw_(
        [master],
        [grad],
        [m],
        [v],
        [],
        [step_t],
        lr=hp.lr,
        beta1=c.betas[0],
        beta2=c.betas[1],
        weight_decay=c.weight_decay if decay else 0.0,
        eps=c.eps,
        amsgrad=False,
        maximize=False,
    )


def _pieces(layout: Ranges, parts: Sequence[Part], chunk: int) -> list[tuple[int, int, bool, Part]]:
    """(lo, hi, decay, part): decay groups x state parts x chunks, in element order."""
    out = []
    for lo, hi, decay in layout.decay_ranges():
        for part in parts:
            a, b = max(lo, part.lo), min(hi, part.hi)
            out.extend((c, min(c + chunk, b), decay, part) for c in range(a, b, chunk))
    return out


def update_host(
    layout: Ranges,
    grad: torch.Tensor,
    parts: Sequence[Part],
    out: torch.Tensor | None,
    hp: StepHp,
    scratch: HostScratch,
    saved: OptState | None = None,
) -> None:
    """AdamW on the host for one unit: `grad` (any float dtype) -> master/moments in `parts`,
    new weights cast into `out` (the compute-dtype copy the next upload reads; None: the unit
    has none, its uploads cast from the master). `saved`: a speculative update's rollback
    slot, which gets the state as it was (the state is then in RAM: one part)."""
    if host_adam.kernel() is None:
        update_host_torch(layout, grad, parts, out, hp, scratch, saved)
        return
    coef = clip_coef(grad, hp.clip_norm, hp.sum_over_ranks)
    scale = hp.grad_scale if hp.grad_scale is not None else 1.0 if coef is None else float(coef)
    c = hp.config
    for lo, hi, decay, part in _pieces(layout, parts, WHOLE):
        st, a, b = part.state, lo - part.lo, hi - part.lo
        host_adam.adamw_(
            grad[lo:hi],
            st.master[a:b],
            st.m[a:b],
            st.v[a:b],
            None if out is None else out[lo:hi],
            step=hp.step,
            lr=hp.lr,
            betas=c.betas,
            eps=c.eps,
            weight_decay=c.weight_decay if decay else 0.0,
            grad_scale=scale,
            saved=None if saved is None else _slice(saved, lo, hi),
        )


def update_host_torch(
    layout: Ranges,
    grad: torch.Tensor,
    parts: Sequence[Part],
    out: torch.Tensor | None,
    hp: StepHp,
    scratch: HostScratch,
    saved: OptState | None = None,
) -> None:
    """`update_host` with torch's fused AdamW over `CHUNK`-element chunks (the fallback, and the
    baseline bench/host/host_adam.py times)."""
    scratch.step.fill_(float(hp.step))
    coef = clip_coef(grad, hp.clip_norm, hp.sum_over_ranks)
    if hp.grad_scale is not None:
        coef = torch.tensor(hp.grad_scale)
    for lo, hi, decay, part in _pieces(layout, parts, CHUNK):
        n, st = hi - lo, part.state
        g = grad[lo:hi]
        if g.dtype != torch.float32 or coef is not None:
            g = scratch.grad[:n].copy_(g)
        if coef is not None:
            g.mul_(coef)
        a, b = lo - part.lo, hi - part.lo
        master, m, v = st.master[a:b], st.m[a:b], st.v[a:b]
        if saved is not None:
            restore(_slice(saved, lo, hi), OptState(master=master, m=m, v=v))
        if scratch.m is not None and scratch.v is not None:  # BF16 moments: update in FP32
            m32, v32 = scratch.m[:n].copy_(m), scratch.v[:n].copy_(v)
            _fused(master, g, m32, v32, scratch.step, hp, decay)
            m.copy_(m32)
            v.copy_(v32)
        else:
            _fused(master, g, m, v, scratch.step, hp, decay)
        if out is not None:
            out[lo:hi].copy_(master)


def _slice(state: OptState, lo: int, hi: int) -> OptState:
    return OptState(master=state.master[lo:hi], m=state.m[lo:hi], v=state.v[lo:hi])


def restore(dst: OptState, src: OptState) -> None:
    """Copy master and moments `src` into `dst` (a rollback, or saving the state for one)."""
    dst.master.copy_(src.master)
    dst.m.copy_(src.m)
    dst.v.copy_(src.v)


def update_device(
    layout: Ranges,
    weights: torch.Tensor,
    grad: torch.Tensor,
    state: OptState,
    hp: StepHp,
    step_t: torch.Tensor,
) -> None:
    """AdamW of a resident or streamed unit, in place on the device (whole unit, no chunking).
    On CUDA one pass of `slide_kernels.adamw_step` per decay range: the gradient, the state and
    the weights each touched once, the clipping scale applied in the pass. Elsewhere torch's
    fused AdamW on an FP32 upcast of the gradient, then the master copied into the weights."""
    if fused.one_pass_adamw(state.master):
        _update_one_pass(layout, weights, grad, state, hp)
        return
    step_t.fill_(float(hp.step))
    g32 = grad if grad.dtype == torch.float32 else grad.float()
    coef = clip_coef(g32, hp.clip_norm, hp.sum_over_ranks)
    if coef is not None:
        g32 = g32 * coef
    if hp.grad_scale is not None:
        g32 = g32 * hp.grad_scale
    for lo, hi, decay in layout.decay_ranges():
        m, v = state.m[lo:hi], state.v[lo:hi]
        m32 = m if m.dtype == torch.float32 else m.float()
        v32 = v if v.dtype == torch.float32 else v.float()
        _fused(state.master[lo:hi], g32[lo:hi], m32, v32, step_t, hp, decay)
        if m32 is not m:
            m.copy_(m32)
            v.copy_(v32)
    weights.copy_(state.master)


def _update_one_pass(
    layout: Ranges, weights: torch.Tensor, grad: torch.Tensor, state: OptState, hp: StepHp
) -> None:
    c = hp.config
    coef = clip_coef(grad, hp.clip_norm, hp.sum_over_ranks)
    scale = hp.grad_scale if hp.grad_scale is not None else 1.0
    for lo, hi, decay in layout.decay_ranges():
        slide_kernels.adamw_step(
            state.master[lo:hi], grad[lo:hi], state.m[lo:hi], state.v[lo:hi], weights[lo:hi],
            step=hp.step, lr=hp.lr, betas=c.betas, eps=c.eps,
            weight_decay=c.weight_decay if decay else 0.0, coef=coef, grad_scale=scale,
        )  # fmt: skip
