"""Running a Program: `run()` in one call, or an `Engine` the controller runs in stretches.

A run does `steps` optimizer steps (each `grad_accum` micro-batches of (batch, seq) tokens) by
repeating the Program's graph (`executor.loop`), from the state it is given (`Start`: weights
and moments by Hugging Face name, and the steps already done, for a resume), and hands back the
FP32 weights and moments, the latest losses and the measured Trace of its trace window.
Periodic checkpoints are taken at step boundaries through `Hooks.on_save`.

The executor decides nothing: the Program (`slide_ir.program`) holds every graph the run's
passes need and the facts it checks and reports; the controller (`slide.session`) planned it,
and re-plans between stretches: `Engine.move` is stop-and-resume, in the same process, into the
engine of another Program.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from executor import handlers, host_adam, leftovers
from executor import knobs as knobs_mod
from executor import setup as setup_mod
from executor.adam import AdamWConfig
from executor.evaluation import Eval, OnEval
from executor.loop import Driver, OnSave, OnStep, Saver
from executor.phases import Phases
from executor.ranks import Ranks
from executor.recording import StepWindow, default_trace_steps
from executor.repetition import NonFiniteLossError
from executor.staging import DataError
from executor.state import ReadState, read_on_main
from slide_ir.ir.drives import NvmeDirs
from slide_ir.ir.graph import Tier
from slide_ir.ir.trace import MemorySample, Trace
from slide_ir.program import Program


class InfeasiblePlanError(RuntimeError):
    """The plan does not fit the machine (or the real device); the message names the tier."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    final_state: dict[str, torch.Tensor]  # HF names, FP32, CPU (empty: `hand_back=False`)
    optim_state: dict[str, torch.Tensor]  # `<name>.exp_avg`, `<name>.exp_avg_sq`, FP32, CPU
    losses: list[float]  # mean token loss of each step done (the last `LOSS_HISTORY`)
    lrs: list[float]
    steps_done: int  # < the steps asked for when stopped early (on_step returned True, Ctrl-C)
    interrupted: bool
    trace: Trace
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Start:
    """The state a run starts from: `step` steps already done (a resume), its LR schedule
    `total_steps` long, `skipped` the global steps of those that global clipping skipped (the
    bias correction counts the updates made)."""

    weights: Mapping[str, torch.Tensor]
    moments: Mapping[str, torch.Tensor] | None = None
    step: int = 0
    total_steps: int
    skipped: frozenset[int] = frozenset()


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """Called on the main thread. on_step(step, loss, lr, metrics) after each step; True stops
    the run after the steps already handed to the lanes (at most one more). on_save(step,
    read_state) after every step whose global number is a multiple of `save_every`, except the
    last: the next step is fed only once it returns. on_finish(step, read_state) once after the
    last step, the engine still up (the caller's final save). Data parallel: pass them on every
    rank; on_save and on_finish are called on rank 0 (the others serve its reads meanwhile).
    `evaluate`: the eval loss after every N steps and the last (`executor.evaluation`; the
    Program must hold its eval passes), one process only."""

    on_step: OnStep | None = None
    on_save: OnSave | None = None
    save_every: int = 0
    on_finish: OnSave | None = None
    evaluate: Eval | None = None


@dataclass(frozen=True, kw_only=True)
class Options:
    """How to run it. `trace_steps`: the steps (1-based, inclusive, counted in this run) whose
    spans and memory the trace keeps (None: `recording.default_trace_steps`); every
    `log_every` steps on_step's metrics add tokens/s and lane busy shares over them;
    `steady_from`: the first step the summary's tokens/s counts. `hand_back=False` leaves the
    result's state empty: gathering a model's whole FP32 state into RAM costs seconds and, for
    state homed on NVMe, the very RAM the NVMe tier saves. `nvme_dir`: drive k's file goes in
    nvme_dir[k % len] (None: a temporary directory). `ranks`: this process's rank of a
    data-parallel run (`executor.ranks`): the batches hold the global micro-batches, each rank
    takes its rows and updates its shard of each unit; only rank 0's result holds the state.
    `max_skipped_steps`: under global clipping, the steps in a row skipped for a non-finite
    gradient norm after which the run stops. Where the Program's token slots hold positions
    (a plan of `TrainConfig.document_mask`), the batches are packed documents, (input_ids,
    labels, positions): each token attends only to its own document's earlier tokens, at RoPE
    positions restarting at 0 in each (`layers.document_rope`)."""

    device: torch.device
    dtype: torch.dtype
    optim: AdamWConfig = field(default_factory=AdamWConfig)
    nvme_dir: NvmeDirs | None = None
    trace_steps: tuple[int, int] | None = None
    log_every: int = 10
    steady_from: int = 2
    hand_back: bool = True
    ranks: Ranks | None = None
    phases: Phases = field(default_factory=Phases)
    max_skipped_steps: int = 10  # global clipping: non-finite steps in a row that stop the run


@dataclass(frozen=True, slots=True)
class Measured:
    """What the lanes did over the steady steps so far, for the controller's re-fit."""

    busy: dict[str, float]  # seconds of op time per lane
    by_kind: dict[str, float]  # the same per op kind
    steps: set[int]  # the steps they cover
    # of the steps done, the share global clipping clipped or skipped (rolled back, where
    # updates speculate); 0 without global clipping
    clipped_share: float = 0.0
    clipped: frozenset[int] = frozenset()  # those steps (of this run, as `steps`)


class Engine:
    """A Program's buffers, state and lanes, over which the controller runs the steps."""

    def __init__(
        self,
        program: Program,
        start: Start,
        batches: Iterable[tuple[torch.Tensor, ...]],
        steps: int,
        hooks: Hooks,
        options: Options,
    ) -> None:
        if options.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {options.log_every}")
        if hooks.evaluate is not None and (not program.evaluation or options.ranks is not None):
            raise ValueError("an eval needs a one-process Program planned with its eval passes")
        for graph in (*program.passes.values(), *program.evaluation.values()):  # before set-up
            handlers.lower(graph)
        check_device(program, options.device)
        self.start, self.steps, self.hooks, self.options = start, steps, hooks, options
        self._closed: setup_mod.Built | None = None
        self._scratch = contextlib.ExitStack()  # holds the scratch directory, if one is made
        self._scratch_dir: Path | None = None
        host_adam.prebuild()  # overlaps the set-up below (a fresh host compiles it)
        try:
            run = self._build(program, start.weights, start.moments, start.step)
            run.env.skipped.update(start.skipped)
        except BaseException as exc:
            self._scratch.close()
            _tell_ranks(options.ranks, exc)
            raise
        saving = hooks.save_every and (hooks.on_save or options.ranks)
        window = StepWindow(*(options.trace_steps or default_trace_steps(steps, None)))
        self.driver = Driver(
            program,
            run,
            iter(batches),
            steps=steps,
            start_step=start.step,
            on_step=hooks.on_step,
            saver=Saver(hooks.save_every, hooks.on_save) if saving else None,
            window=window,
            log_every=options.log_every,
            steady_from=options.steady_from,
            max_skipped_steps=options.max_skipped_steps,
            evaluate=hooks.evaluate,
        )

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        """Release the engine; data parallel: a peer's failure, when one was published, is
        what stopped this rank (its collectives broke): raise that, else publish this one's."""
        self.close()
        if exc is not None:
            _tell_ranks(self.options.ranks, exc)

    @property
    def done(self) -> int:
        return self.driver.progress.done

    @property
    def stopped(self) -> bool:
        return self.driver.progress.stop

    def advance(self, until: int) -> None:
        """Run the steps up to `until` (of this run), or until the run is stopped."""
        self.options.phases.mark("lanes")
        self.driver.advance(min(until, self.steps))

    def measured(self) -> Measured:
        recorder = self.driver.progress.recorder
        steps = set(range(2, self.done + 1))
        first = self.start.step
        clipped = frozenset(s - first for s in self.driver.built.env.clipped
                            if first < s <= first + self.done)  # fmt: skip
        share = len(clipped) / self.done if self.done else 0.0
        return Measured(recorder.steady_busy(), recorder.steady_busy_by_kind(), steps, share,
                        clipped)  # fmt: skip

    def setup_seconds(self) -> float:
        """This engine's buffers and state set-up: what a move pays about twice over."""
        seconds = self.options.phases.seconds
        return seconds.get("buffers", 0.0) + seconds.get("state", 0.0)

    def move(self, program: Program) -> None:
        """Stop and resume in `program`'s engine: the state moves through host memory."""
        check_device(program, self.options.device)
        old = self.driver.built
        weights, moments = old.extract()
        old.close()
        self._closed = old
        moved = self._build(program, weights, moments, self.start.step + self.done, Phases())
        moved.env.skipped.update(old.env.skipped)  # the bias correction counts updates made
        moved.env.clipped.update(old.env.clipped)
        self.driver.move(program, moved)

    def finish(self) -> TrainResult:
        """The result, after on_finish; the engine is still up until `close`."""
        driver, phases, opts = self.driver, self.options.phases, self.options
        pr, run = driver.progress, driver.built
        if "first step end" in phases.marks:
            phases.add("steps", phases.since("first step end"))
        if host_adam.ready_s is not None:
            phases.add("host AdamW kernel", host_adam.ready_s, overlapped=True)
        if self.hooks.on_finish is not None:
            on_finish, at = self.hooks.on_finish, self.start.step + pr.done
            read_on_main(run.env, lambda read: on_finish(at, read))
        weights: dict[str, torch.Tensor] = {}
        moments: dict[str, torch.Tensor] = {}
        if opts.hand_back:
            with phases("hand-back"):
                weights, moments = run.extract()
        now = time.perf_counter() - pr.recorder.t0  # the host copy of GPU-kept state counts too
        pr.memory.add(pr.done, run.memory_sample(now))
        trace = Trace(
            spans=pr.recorder.window_spans(),
            memory=pr.memory.all(),
            info=driver.trace_info,
            meta=run.meta(knobs_mod.from_env()),
        )
        return TrainResult(
            final_state=weights,
            optim_state=moments,
            losses=pr.losses.values(),
            lrs=pr.lrs.values(),
            steps_done=pr.done,
            interrupted=pr.interrupted,
            trace=trace,
            meta=dict(trace.meta) | {"steady": pr.steady.summary()},
        )

    def close(self) -> None:
        if self.driver.built is not self._closed:  # else a move failed between the engines
            with self.options.phases("release"):
                self.driver.built.close()
        self._scratch.close()

    def _drive_dir(self, program: Program) -> NvmeDirs:
        """Drive k's file goes in nvme_dir[k % len]; none given: a scratch directory, made
        only for a Program with pools on NVMe and removed on close (`executor.leftovers`: a
        killed run's is removed by the next)."""
        if self.options.nvme_dir:
            return self.options.nvme_dir
        if self._scratch_dir is None and any(p.tier == Tier.NVME for p in program.graph.pools):
            self._scratch_dir = self._scratch.enter_context(leftovers.scratch_dir())
        return self._scratch_dir or Path(tempfile.gettempdir())

    def _build(
        self,
        program: Program,
        weights: Mapping[str, torch.Tensor],
        moments: Mapping[str, torch.Tensor] | None,
        step: int,
        phases: Phases | None = None,
    ) -> setup_mod.Built:
        opts = self.options
        return setup_mod.build(
            program,
            device=opts.device,
            dtype=opts.dtype,
            optim=opts.optim,
            step_offset=step,
            total_steps=self.start.total_steps,
            nvme_dir=self._drive_dir(program),
            initial_state=weights,
            initial_optim_state=moments,
            phases=phases or opts.phases,
            ranks=opts.ranks,
        )


def run(
    program: Program,
    start: Start,
    batches: Iterable[tuple[torch.Tensor, ...]],
    steps: int,
    hooks: Hooks,
    options: Options,
) -> TrainResult:
    """`steps` steps of `program` from `start` (see the module docstring)."""
    with Engine(program, start, batches, steps, hooks, options) as engine:
        engine.advance(steps)
        return engine.finish()


def check_device(program: Program, device: torch.device) -> None:
    """The ledger's GPU bytes against the real device, before anything is allocated (the
    planner checked them against the machine profile)."""
    if device.type != "cuda":
        return
    _, total = torch.cuda.mem_get_info(device)
    if program.gpu_bytes > total:
        raise InfeasiblePlanError(
            f"the plan needs {program.gpu_bytes / 2**30:.2f} GiB of GPU memory; "
            f"{torch.cuda.get_device_name(device)} has {total / 2**30:.2f} GiB "
            f"({(program.gpu_bytes - total) / 2**30:.2f} GiB short)"
        )


def _tell_ranks(ranks: Ranks | None, exc: BaseException) -> None:
    failure = ranks.settle(exc) if ranks is not None else None
    if failure is not None:
        raise failure from exc


__all__ = [
    "AdamWConfig",
    "DataError",
    "Engine",
    "Eval",
    "Hooks",
    "InfeasiblePlanError",
    "MemorySample",
    "NonFiniteLossError",
    "OnEval",
    "OnSave",
    "OnStep",
    "Options",
    "ReadState",
    "Start",
    "TrainResult",
    "run",
]
