"""The main thread's part of a run: repeat the Program's graph until the steps asked for are
done, saving and evaluating between passes (`executor.repetition` runs one pass: feeding
micro-batches, waiting for each step, reporting it, saving inside the pass).

The Program's graph covers a few steps; a longer run repeats it, the lanes joined and restarted
between repetitions (milliseconds), the Adam step count and LR offset by the steps already run.
Each repetition's first step starts from the state the previous one left, which is what its
graph assumes of a fresh run: every unit's home copy (host or device) holds the latest weights
when all ops have finished. The controller runs the steps in stretches (`Driver.advance`): to
check its placement after a few, then on, in the same engine or, after a move, another one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from executor import setup as setup_mod
from executor import state as state_mod
from executor.env import Env
from executor.evaluation import Eval, Evaluator
from executor.interrupts import DeferredInterrupts
from executor.progress import Progress
from executor.recording import MemoryLog, Recorder, StepWindow
from executor.repetition import Batches, Repetition
from executor.runtime import Lanes, Shared, make_shared
from executor.state import ReadState
from slide_ir.program import Program, next_pass

log = logging.getLogger("executor.loop")

OnStep = Callable[[int, float, float, dict[str, Any]], bool | None]
OnSave = Callable[[int, ReadState], None]


@dataclass(frozen=True, slots=True)
class Saver:
    every: int
    on_save: OnSave | None  # None on a data-parallel rank that only serves rank 0's reads

    def due(self, global_step: int) -> bool:
        return global_step % self.every == 0

    def save(self, global_step: int, run: setup_mod.Built) -> None:
        """On rank 0 of a data-parallel run; the other ranks serve its reads meanwhile."""
        if run.env.cuda:
            torch.cuda.synchronize(run.env.device)
        on_save = self.on_save
        state_mod.read_on_main(run.env, lambda read: on_save and on_save(global_step, read))


class Driver:
    """Runs a Program's `steps` steps in stretches (see the module docstring); the last is
    not saved (the caller's final save is)."""

    def __init__(
        self,
        program: Program,
        run: setup_mod.Built,
        it: Batches,
        *,
        steps: int,
        start_step: int,
        on_step: OnStep | None,
        saver: Saver | None,
        window: StepWindow,
        log_every: int,
        steady_from: int = 2,
        max_skipped_steps: int = 10,
        evaluate: Eval | None = None,
    ) -> None:
        self.program, self.built, self.it, self.steps = program, run, it, steps
        self.evaluate = evaluate
        self.max_skipped_steps = max_skipped_steps
        self.start_step, self.on_step, self.saver = start_step, on_step, saver
        self.interrupts = DeferredInterrupts()
        recorder = Recorder(run.env.cuda, window)
        self.window = window
        self.trace_info = program.info  # the graph the trace window's spans ran
        memory = MemoryLog(window, run.memory_at_start(recorder.t0))
        self.progress = Progress.start(
            recorder, memory, log_every=log_every, steady_from=steady_from
        )

    def advance(self, until: int) -> Progress:
        """Run steps until `until` of this run are done (or it stops); a Ctrl-C meanwhile lands
        only in a step's wait (see `interrupts`)."""
        with self.interrupts:
            return self._passes(until)

    def move(self, program: Program, run: setup_mod.Built) -> None:
        """Go on in another engine, built for `program` from the state this one left."""
        self.program, self.built = program, run
        if self.progress.done < self.window.first:
            self.trace_info = program.info

    def _passes(self, until: int) -> Progress:
        pr, env = self.progress, self.built.env
        threads = self.program.cpu_threads if env.cuda else None
        lanes = Lanes(env, self.program.graph.lanes(), threads)
        shared: Shared | None = None
        try:
            engines, ran = self._engines(env, until), set[int]()
            evaluator = Evaluator(self.evaluate, env, self.program) if self.evaluate else None
            while pr.done < until and not pr.stop:
                n = self._next_pass(pr.done, until)
                shared = engines[n]
                if n in ran:
                    shared.rerun()
                ran.add(n)
                if not self._repeat(lanes, shared, n):
                    break
                global_step = self.start_step + pr.done
                if self.saver and pr.done < self.steps and self.saver.due(global_step):
                    self.saver.save(global_step, self.built)
                if evaluator is not None:
                    self._evaluate(evaluator, lanes, global_step)
        except BaseException as exc:
            if env.ranks is not None:  # tell the other ranks first: they may be waiting on us
                env.ranks.settle(shared.error[0] if shared is not None and shared.error else exc)
            lanes.stop(shared, abort=True)  # a lane's error, if any, wins
            raise
        lanes.stop(shared, abort=pr.stop)
        if env.cuda:
            torch.cuda.synchronize(env.device)
        pr.recorder.resolve(pr.done)
        return pr

    def _engines(self, env: Env, until: int) -> dict[int, Shared]:
        """What each pass up to `until` needs (its graph, completions, events), by pass
        length, made now: a pass's graph made in the steady state was host memory taken there."""
        lengths, at = dict[int, None](), self.progress.done
        while at < until:
            lengths[n := self._next_pass(at, until)] = None
            at += n
        return {
            n: make_shared(env, self.program.pass_graph(n), self.progress.recorder) for n in lengths
        }

    def _evaluate(self, evaluator: Evaluator, lanes: Lanes, global_step: int) -> None:
        """The eval due after `global_step` (its every-N step, or the run's last), if one is."""
        pr = self.progress
        if not (evaluator.ev.due(global_step) or pr.done == self.steps):
            return
        if evaluator.run(lanes, global_step, self.interrupts):
            log.warning("interrupted: the eval after step %d is done", global_step)
            pr.stop = pr.interrupted = True

    def _next_pass(self, done: int, until: int) -> int:
        """Steps of the pass after `done` on the way to `until`: it ends where an eval is due."""
        if self.evaluate is not None:
            due = self.evaluate.next_stop(self.start_step + done) - self.start_step
            until = min(until, due)
        return next_pass(self.program.info.steps, done, until)

    def _repeat(self, lanes: Lanes, shared: Shared, n: int) -> bool:
        """One pass over the graph; False when the run stopped inside it."""
        env, pr = self.built.env, self.progress
        env.step_offset = self.start_step + pr.done
        pr.recorder.offset = pr.done
        rep = Repetition(self, shared, n)
        rep.feed()
        lanes.run(shared)
        rep.run()
        if rep.reported < n:
            return False
        if env.cuda:  # every op of the pass is done, its device work too, before the next
            torch.cuda.synchronize(env.device)
        pr.recorder.resolve(pr.done)
        return not pr.stop
