"""What a run keeps across the passes over its graph and reports per step: the recent losses
and LRs, the steady steps' totals behind the summary's tokens/s, the clock of the last report
and of the last `log_every` interval, the count of skipped steps in a row.

Everything here is bounded (`LOSS_HISTORY`, `executor.recording`), so a run of any length holds
the same memory; aggregates over every step come from on_step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from executor.ranks import Ranks
from executor.recording import MemoryLog, RecentValues, Recorder
from slide_ir.program import Program

LOSS_HISTORY = 10_000  # the last losses and LRs a result keeps (aggregates come from on_step)


@dataclass
class SteadySteps:
    """Running totals over this run's steps from `first` on: the summary's tokens/s covers
    every steady step, not only the trace window's few (on the H200 a GPU-bound llama-3.1-8b
    step varies by up to 10% from one step to the next)."""

    first: int
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    clipped: int = 0  # of them, global clipping's clipped or skipped steps (rolled back)

    def add(self, step: int, seconds: float, tokens: int, *, clipped: bool = False) -> None:
        if step >= self.first:
            self.steps, self.seconds, self.tokens = (
                self.steps + 1, self.seconds + seconds, self.tokens + tokens
            )  # fmt: skip
            self.clipped += clipped

    def summary(self) -> dict[str, Any]:
        return {"first": self.first, "steps": self.steps, "seconds": self.seconds,
                "tokens": self.tokens, "clipped": self.clipped}  # fmt: skip


@dataclass(kw_only=True)
class Progress:
    """What the run keeps across repetitions: bounded (see `LOSS_HISTORY`, `recording`)."""

    recorder: Recorder
    memory: MemoryLog
    log_every: int
    losses: RecentValues
    lrs: RecentValues
    steady: SteadySteps
    done: int = 0  # steps finished in this run
    stop: bool = False
    interrupted: bool = False
    last: float = 0.0  # clock at the previous report
    interval: tuple[float, int, dict[str, float]] = (0.0, 0, {})  # (clock, done, lane busy)
    skipped_in_row: int = 0  # steps in a row a non-finite gradient norm skipped

    @classmethod
    def start(
        cls, recorder: Recorder, memory: MemoryLog, *, log_every: int, steady_from: int
    ) -> Progress:
        """A run's progress before its first step, the clock at the recorder's start."""
        return cls(
            recorder=recorder,
            memory=memory,
            log_every=log_every,
            losses=RecentValues(LOSS_HISTORY),
            lrs=RecentValues(LOSS_HISTORY),
            steady=SteadySteps(steady_from),
            last=recorder.t0,
            interval=(recorder.t0, 0, {}),
        )


def tokens_per_step(p: Program, ranks: Ranks | None) -> int:
    """The step's tokens over every rank (a rank's graph holds its own rows)."""
    return p.info.tokens_per_step * (ranks.nproc if ranks is not None else 1)


def step_metrics(p: Program, seconds: float, ranks: Ranks | None = None) -> dict[str, Any]:
    """The step's figures; data parallel: tokens over all ranks, TFLOP/s per GPU."""
    tokens = tokens_per_step(p, ranks)
    return {
        "step_time_s": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else float("inf"),
        "model_tflops": p.info.flops_per_step / seconds / 1e12 if seconds > 0 else 0.0,
    }
