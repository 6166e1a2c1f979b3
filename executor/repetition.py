"""One pass over the Program's graph (its n steps, numbered 1..n in its ops), on the main
thread: feed the micro-batches, wait for each step, report it, save inside the pass.

Feed step s+1 (the graph's feed window, `GraphInfo.feed_ahead`), wait for step s, report it.
Feeding one step ahead keeps the lanes busy across the step boundary; stopping (on_step returned True, Ctrl-C) stops feeding, so the state after
the last fed step is consistent. Before a save, and at the end of a stretch (`Driver.advance`),
the next step is not fed: with no micro-batch the lanes cannot reach its backward, so no update
touches the state while it is read (uploads and prefetches of the next step only read it).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from executor.env import MicroBatch
from executor.free_lists import fill_tuple_free_lists
from executor.interrupts import AbortRun
from executor.progress import step_metrics, tokens_per_step
from executor.ranks import Ranks
from executor.runtime import Shared, wait_ops
from executor.staging import DataError, TokenStaging, check_batch
from slide_ir.ir.graph import GraphInfo

if TYPE_CHECKING:
    from executor.loop import Driver

log = logging.getLogger("executor.repetition")

# (input_ids, labels), or for packed documents (input_ids, labels, positions)
Batches = Iterator[tuple[torch.Tensor, ...]]


class NonFiniteLossError(FloatingPointError):
    """A step's loss is not finite, or too many steps in a row were skipped: the run stops."""


class Repetition:
    """One pass over the graph's n steps (step numbers 1..n in its ops)."""

    def __init__(self, d: Driver, shared: Shared, n: int) -> None:
        self.d, self.shared, self.n = d, shared, n
        self.fed = self.reported = 0
        self.base = d.start_step + d.progress.done  # global steps before this repetition

    def feed(self) -> None:
        self.fed += 1
        env, info = self.d.built.env, self.d.program.info
        for mb in micro_batches(self.d.it, self.fed, info, self.base, env.staging,
                                self.shared.fed, env.ranks):  # fmt: skip
            env.batches.put(mb)

    def run(self) -> None:
        pr = self.d.progress
        for step in range(1, self.n + 1):
            ahead = min(step + self.d.program.info.feed_ahead, self.n)
            while not pr.stop and self.fed < ahead and not self.saving(step):
                self.feed()
            try:
                wait_ops(self.shared, self.shared.by_step[step], self.d.interrupts)
            except KeyboardInterrupt as interrupt:
                if pr.stop or isinstance(interrupt, AbortRun):  # a second Ctrl-C, or "abort"
                    raise
                log.warning("interrupted: finishing the %d step(s) started", self.fed - step + 1)
                pr.stop = pr.interrupted = True
                wait_ops(self.shared, self.shared.by_step[step], self.d.interrupts)
            self.report(step)
            if pr.stop and step == self.fed:
                return
            if self.saving(step):
                assert self.d.saver is not None
                self.d.saver.save(self.base + step, self.d.built)
                self.feed()

    def saving(self, step: int) -> bool:
        """Whether the state after `step` is saved before step + 1 is fed."""
        saver = self.d.saver
        return (
            saver is not None and step == self.fed and step < self.n and saver.due(self.base + step)
        )

    def report(self, step: int) -> None:
        d, pr = self.d, self.d.progress
        env, now = d.built.env, time.perf_counter()
        self.reported = step
        pr.done += 1
        pr.recorder.resolve(pr.done)
        loss = float(env.buffers.tensor(self.shared.host_losses[step]))
        if env.ranks is not None:  # each rank's part of the step's mean loss
            loss = float(env.ranks.sum_(torch.tensor([loss], dtype=torch.float64), "main")[0])
        lr = env.optim.lr_at(self.base + step, env.total_steps)
        pr.losses.append(loss)
        pr.lrs.append(lr)
        pr.memory.add(pr.done, d.built.memory_sample(now - pr.recorder.t0))
        self._check_finite(self.base + step, loss)
        metrics = step_metrics(d.program, now - pr.last, env.ranks) | self._interval(now)
        metrics |= self._clipping(self.base + step)
        pr.steady.add(pr.done, metrics["step_time_s"], metrics["tokens"],
                      clipped=bool(metrics.get("clipped")))  # fmt: skip
        pr.last = now
        stop = d.on_step is not None and bool(d.on_step(self.base + step, loss, lr, metrics))
        if env.ranks is not None:  # a rank that stops stops them all, at the same step
            said = torch.tensor([int(stop or pr.stop)], dtype=torch.int64)
            stop = bool(env.ranks.sum_(said, "main")[0])
        pr.stop = pr.stop or stop
        if pr.done == 1:  # the first step's one-time objects are made: the steady state begins
            fill_tuple_free_lists()

    def _check_finite(self, step: int, loss: float) -> None:
        """A step global clipping skipped is counted (the run stops after `max_skipped_steps`
        in a row); any other non-finite loss stops the run, its update already made."""
        pr, env = self.d.progress, self.d.built.env
        if step in env.skipped:
            pr.skipped_in_row += 1
            log.warning("step %d: the gradient norm is %s: step skipped, the state untouched",
                        step, env.grad_norms.get(step))  # fmt: skip
            if pr.skipped_in_row >= self.d.max_skipped_steps:
                raise NonFiniteLossError(
                    f"step {step}: {pr.skipped_in_row} steps in a row had non-finite gradients "
                    "and were skipped; stopping (the state is that of the last good step)"
                )
            return
        pr.skipped_in_row = 0
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"step {step}: loss is {loss}; stopping (this step's update has already been "
                "applied: keep the previous checkpoint)"
            )

    def _clipping(self, step: int) -> dict[str, Any]:
        """Global clipping's figures of the step: its gradient norm, whether it clipped (or was
        skipped: speculated updates rolled back), the steps skipped so far."""
        env = self.d.built.env
        if step not in env.grad_norms:
            return {}
        norm = env.grad_norms.pop(step)
        return {"grad_norm": norm if math.isfinite(norm) else None,
                "clipped": step in env.clipped, "skipped": step in env.skipped,
                "skipped_steps": len(env.skipped)}  # fmt: skip

    def _interval(self, now: float) -> dict[str, Any]:
        """Every `log_every` steps: tokens/s and each lane's busy share over those steps, and
        the memory in use."""
        pr = self.d.progress
        if pr.done % pr.log_every:
            return {}
        t, done, busy = pr.interval
        seconds = now - t
        tokens = tokens_per_step(self.d.program, self.d.built.env.ranks) * (pr.done - done)
        lanes = {
            lane: round((total - busy.get(lane, 0.0)) / seconds, 4)
            for lane, total in sorted(pr.recorder.busy.items())
        }
        pr.interval = (now, pr.done, dict(pr.recorder.busy))
        return {"last_n_steps": pr.done - done, "last_n_tokens_per_s": tokens / seconds,
                "lane_busy": lanes, **self.d.built.memory_now()}  # fmt: skip


def micro_batches(
    it: Batches,
    step: int,
    info: GraphInfo,
    base: int,
    staging: TokenStaging,
    fed: dict[tuple[int, int], str],
    ranks: Ranks | None = None,
) -> list[MicroBatch]:
    """The step's micro-batches, checked, each staged in the host slot `fed` names and scaled
    by 1 / (labelled tokens of the step).
    Data parallel: the data holds the global batch, each rank takes its rows (`info` is the
    rank's graph's), the scale counts every rank's tokens."""
    nproc, rank = (ranks.nproc, ranks.rank) if ranks is not None else (1, 0)
    rows = slice(rank * info.batch, (rank + 1) * info.batch)
    shape = (nproc * info.batch, info.seq)
    raw = []
    for micro in range(info.grad_accum):
        try:
            batch = next(it)
        except StopIteration:
            raise DataError(
                f"the data ran out at step {base + step}, micro-batch {micro} (each step takes "
                f"{info.grad_accum} micro-batches of {shape})"
            ) from None
        check_batch(batch, shape, staging.documents, f"step {base + step}")
        raw.append(batch)
    valid = sum(int((batch[1] != -100).sum()) for batch in raw)
    if valid == 0:
        raise DataError(f"step {base + step}: no labelled token (all labels are -100)")
    for m, batch in enumerate(raw):
        staging.stage(fed[(step, m)], *(t[rows] for t in batch))
    return [MicroBatch(step=step, micro=m, scale=1.0 / valid) for m in range(len(raw))]
