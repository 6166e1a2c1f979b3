"""The eval loss: a Program's eval passes (`Program.evaluation`) run on the run's lanes between
training passes.

An eval is due after every `Eval.every`-th global step and after the run's last step; the
driver ends its training passes there (`Eval.next_stop`), so an eval starts on drained lanes
and the next training pass on drained lanes again, as any pass does. Its graphs are forward
only and write nothing the training graph reads (`slide_ir.planning.evaluation`): the state
after a run with evals is bitwise that of the run without. The eval set's batches are fed as
the training ones are (one ahead, in the engine's token staging), with scale 1, so each batch's
loss slot holds its summed token loss; the eval loss is their sum over the labelled tokens
counted here, the mean token cross-entropy of the eval batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from executor.env import Env, MicroBatch
from executor.interrupts import AbortRun, DeferredInterrupts
from executor.recording import StepWindow, Unrecorded
from executor.runtime import Lanes, Shared, make_shared, wait_ops
from executor.staging import check_batch
from slide_ir.program import Program

Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]
OnEval = Callable[[int, float, dict[str, Any]], None]
IGNORE_INDEX = -100


@dataclass(frozen=True, kw_only=True)
class Eval:
    """Evaluate after every `every`-th global step and after the last: `batches` batches of
    `data()` (a fresh iterator each time: the same batches every eval), reported to
    `on_eval(global_step, loss, figures)` on the main thread."""

    every: int
    batches: int
    data: Callable[[], Batches]
    on_eval: OnEval | None = None

    def __post_init__(self) -> None:
        if self.every < 1 or self.batches < 1:
            raise ValueError(f"eval every {self.every} steps over {self.batches} batches: "
                             "both must be >= 1")  # fmt: skip

    def due(self, global_step: int) -> bool:
        return global_step % self.every == 0

    def next_stop(self, global_done: int) -> int:
        """The global step after which the next eval is due."""
        return (global_done // self.every + 1) * self.every


class Evaluator:
    """One stretch's eval passes: their graphs' completions and events made once, like the
    training passes' (`loop.Driver._engines`), their spans recorded nowhere."""

    def __init__(self, ev: Eval, env: Env, program: Program) -> None:
        self.ev, self.env, self.program = ev, env, program
        quiet = Unrecorded(env.cuda, StepWindow(1, 1))
        self.shared = {n: make_shared(env, g, quiet) for n, g in program.evaluation.items()}
        self.ran: set[int] = set()

    def run(self, lanes: Lanes, global_step: int, interrupts: DeferredInterrupts) -> bool:
        """Every eval batch once, reported; True when a Ctrl-C came meanwhile (the eval is
        finished first: the lanes are handed back drained)."""
        start, data = time.perf_counter(), self.ev.data()
        total, tokens, done, interrupted = 0.0, 0, 0, False
        while done < self.ev.batches:
            n = self.program.eval_pass(done, self.ev.batches)
            shared = self.shared[n]
            if n in self.ran:
                shared.rerun()
            self.ran.add(n)
            tokens += self._feed(data, shared, 1)
            lanes.run(shared)
            ahead = shared.graph.info.feed_ahead
            for step in range(1, n + 1):
                for later in range(step + 1, min(step + ahead, n) + 1):
                    tokens += self._feed(data, shared, later)
                interrupted |= _wait(shared, step, interrupts)
                total += float(self.env.buffers.tensor(shared.host_losses[step]))
            if self.env.cuda:
                torch.cuda.synchronize(self.env.device)
            done += n
        if tokens == 0:
            raise ValueError(f"the {self.ev.batches} eval batches hold no labelled token")
        if self.ev.on_eval is not None:
            figures = {"eval_tokens": tokens, "eval_batches": self.ev.batches,
                       "eval_s": time.perf_counter() - start}  # fmt: skip
            self.ev.on_eval(global_step, total / tokens, figures)
        return interrupted

    def _feed(self, data: Batches, shared: Shared, step: int) -> int:
        """Stage eval batch `step` of the pass in the host slot its graph names; its labelled
        tokens."""
        info = shared.graph.info
        try:
            batch = next(data)
        except StopIteration:
            raise ValueError(
                f"the eval data ran out before its {self.ev.batches} batches"
            ) from None
        check_batch(batch, (info.batch, info.seq), self.env.staging.documents, "eval")
        self.env.staging.stage(shared.fed[(step, 0)], *batch)
        self.env.batches.put(MicroBatch(step=step, micro=0, scale=1.0))
        labels = batch[1]
        return int((labels != IGNORE_INDEX).sum())


def _wait(shared: Shared, step: int, interrupts: DeferredInterrupts) -> bool:
    """Wait for eval batch `step`'s ops; a first Ctrl-C is noted (True) and the wait goes on,
    a second, or an abort, is raised. A lane's failure is raised as itself."""
    try:
        try:
            wait_ops(shared, shared.by_step[step], interrupts)
            return False
        except KeyboardInterrupt as interrupt:
            if isinstance(interrupt, AbortRun):
                raise
            wait_ops(shared, shared.by_step[step], interrupts)
            return True
    except BaseException:
        if shared.error:
            raise shared.error[0] from None
        raise
