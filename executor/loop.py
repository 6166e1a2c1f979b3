"""The main thread's part of a run: repeat the Program's graph until the steps asked for are
done, feeding micro-batches, waiting for each step, reporting it, saving at step boundaries.

The Program's graph covers a few steps; a longer run repeats it, the lanes joined and restarted
between repetitions (milliseconds), the Adam step count and LR offset by the steps already run.
Each repetition's first step starts from the state the previous one left, which is what its
graph assumes of a fresh run: every unit's home copy (host or device) holds the latest weights
when all ops have finished. The controller runs the steps in stretches (`Driver.advance`): to
check its placement after a few, then on, in the same engine or, after a move, another one.

Within a repetition: feed step s+1, wait for step s, report it. Feeding one step ahead keeps the
lanes busy across the step boundary; stopping (on_step returned True, Ctrl-C) stops feeding, so
the state after the last fed step is consistent. Before a save, and at the end of a stretch,
the next step is not fed: with no micro-batch the lanes cannot reach its backward, so no update
touches the state while it is read (uploads and prefetches of the next step only read it).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from executor import setup as setup_mod
from executor import state as state_mod
from executor.env import Env, MicroBatch
from executor.evaluation import Eval, Evaluator
from executor.free_lists import fill_tuple_free_lists
from executor.interrupts import AbortRun, DeferredInterrupts
from executor.ranks import Ranks
from executor.recording import MemoryLog, RecentValues, Recorder, StepWindow
from executor.runtime import Lanes, Shared, make_shared, wait_ops
from executor.staging import DataError, TokenStaging, check_batch
from executor.state import ReadState
from slide_ir.ir.graph import GraphInfo
from slide_ir.program import Program, next_pass

log = logging.getLogger("executor.loop")

LOSS_HISTORY = 10_000  # the last losses and LRs a result keeps (aggregates come from on_step)
OnStep = Callable[[int, float, float, dict[str, Any]], bool | None]
OnSave = Callable[[int, ReadState], None]
# (input_ids, labels), or for packed documents (input_ids, labels, positions)
Batches = Iterator[tuple[torch.Tensor, ...]]


class NonFiniteLossError(FloatingPointError):
    pass


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
        self.progress = Progress(
            recorder=recorder,
            memory=MemoryLog(window, run.memory_at_start(recorder.t0)),
            log_every=log_every,
            losses=RecentValues(LOSS_HISTORY),
            lrs=RecentValues(LOSS_HISTORY),
            steady=SteadySteps(steady_from),
            last=recorder.t0,
            interval=(recorder.t0, 0, {}),
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
        env.loss_dev.zero_()
        pr.recorder.offset = pr.done
        rep = _Repetition(self, shared, n)
        rep.feed()
        lanes.run(shared)
        rep.run()
        if rep.reported < n:
            return False
        if env.cuda:  # every op of the pass is done, its device work too, before the next
            torch.cuda.synchronize(env.device)
        pr.recorder.resolve(pr.done)
        return not pr.stop


class _Repetition:
    """One pass over the graph's n steps (step numbers 1..n in its ops)."""

    def __init__(self, d: Driver, shared: Shared, n: int) -> None:
        self.d, self.shared, self.n = d, shared, n
        self.fed = self.reported = 0
        self.base = d.start_step + d.progress.done  # global steps before this repetition

    def feed(self) -> None:
        self.fed += 1
        env, info = self.d.built.env, self.d.program.info
        for mb in micro_batches(self.d.it, self.fed, info, self.base, env.staging, env.ranks):
            env.batches.put(mb)

    def run(self) -> None:
        pr = self.d.progress
        for step in range(1, self.n + 1):
            while not pr.stop and self.fed < min(step + 1, self.n) and not self.saving(step):
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
        loss = float(env.loss_host[step - 1])
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
        tokens = _tokens_per_step(self.d.program, self.d.built.env.ranks) * (pr.done - done)
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
    ranks: Ranks | None = None,
) -> list[MicroBatch]:
    """The step's micro-batches, checked, each scaled by 1 / (labelled tokens of the step).
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
    return [
        MicroBatch(
            step=step, micro=m, tokens=staging.stage(*(t[rows] for t in batch)), scale=1.0 / valid
        )
        for m, batch in enumerate(raw)
    ]


def _tokens_per_step(p: Program, ranks: Ranks | None) -> int:
    """The step's tokens over every rank (a rank's graph holds its own rows)."""
    return p.info.tokens_per_step * (ranks.nproc if ranks is not None else 1)


def step_metrics(p: Program, seconds: float, ranks: Ranks | None = None) -> dict[str, Any]:
    """The step's figures; data parallel: tokens over all ranks, TFLOP/s per GPU."""
    tokens = _tokens_per_step(p, ranks)
    return {
        "step_time_s": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else float("inf"),
        "model_tflops": p.info.flops_per_step / seconds / 1e12 if seconds > 0 else 0.0,
    }
