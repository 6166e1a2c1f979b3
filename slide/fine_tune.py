"""One `slide train` run with the engine up: `slide.session.train` called once, with the hooks
that report each step, record the steps global clipping skipped, write periodic checkpoints at
step boundaries and the final one after the last step, then the run's summary.

Checkpoints follow `slide.checkpoints` (complete or absent, published by one rename, the
previous one removed only after). A run that fails publishes the checkpoint in flight first; a
second Ctrl-C cancels it instead (`slide.ctrl_c`); a non-finite loss ends with code 1, naming
the last checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from executor.adam import AdamWConfig
from executor.phases import Phases
from executor.ranks import Ranks
from executor.run import Eval, NonFiniteLossError, OnSave, OnStep, ReadState, TrainResult
from slide.checkpoints import RunDir
from slide.ctrl_c import CtrlC
from slide.errors import StopRun
from slide.eval_data import EvalSet
from slide.resume import state_json
from slide.saving import Checkpointer, StateWriter
from slide.session import train
from slide.tokenizer import tokenizer_files
from slide.train_data import tiny_tokenizer
from slide.train_prepare import Prepared
from slide.train_report import Reporter, finish, memory_warning, phase_summary, prediction_warning
from slide.train_request import TrainRequest
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

log = logging.getLogger(__name__)


def fine_tune(
    ready: Prepared,
    weights: Mapping[str, torch.Tensor],
    run_dir: RunDir | None,
    phases: Phases,
    replan_request: TrainConfig | None,
    ranks: Ranks | None,
) -> dict[str, Any]:
    """Train `ready`'s run from `weights`, checkpoints into `run_dir`; the run's summary with
    where its wall time went (`phases`)."""
    req, planned, resumed = ready.req, ready.planned, ready.resumed
    start = resumed.steps_done if resumed else 0
    # the global steps global clipping skipped, in order: a background save reads it meanwhile
    skipped = list(resumed.skipped_steps if resumed else ())
    ckpt = _checkpointer(req, planned.model, ready.optim, run_dir, skipped) if run_dir else None
    reporter = Reporter(req, total=req.config.steps, start=start, phases=phases)
    evaluate = _evaluate(req, ready.eval_set, reporter) if ready.eval_set else None
    stop = CtrlC()
    on_step, final_save = _step_hooks(stop, reporter, skipped, ckpt, start, phases)
    try:
        with _stopping(stop, ckpt):
            result = train(
                planned.model,
                planned.machine,
                replace(planned.config, steps=req.config.steps - start, batch=req.config.batch),
                initial_state=weights,
                planned=planned,
                batches=ready.data,
                optim=ready.optim,
                device=torch.device(req.device) if req.device else None,
                dtype=_dtype(req.dtype),
                on_step=on_step,
                initial_optim_state=resumed.moments if resumed else None,
                start_step=start,
                skipped_steps=skipped,
                nvme_dir=[Path(d) for d in req.nvme_dirs] or None,
                save_every=req.save_every,
                on_save=ckpt.save if ckpt else None,
                trace_steps=req.trace_steps,
                log_every=req.log_every,
                max_skipped_steps=req.max_skipped_steps,
                phases=phases,
                on_finish=final_save,
                hand_back=False,
                replan_request=replan_request,
                refit_profile=req.machine == "auto",
                ranks=ranks,
                evaluate=evaluate,
            )
            stop.finishing()
            done = start + result.steps_done
            if ckpt:
                ckpt.wait()
    finally:
        reporter.close()
    last = ckpt.last if ckpt else None
    return _summary(ready, result, done, reporter, last, stop.requested, phases, ranks)


def _summary(
    ready: Prepared,
    result: TrainResult,
    done: int,
    reporter: Reporter,
    last: Path | None,
    interrupted: bool,
    phases: Phases,
    ranks: Ranks | None,
) -> dict[str, Any]:
    """The run's summary and its phases (`slide.train_report`); a warning where the measured
    step strayed from the prediction."""
    req = ready.req
    with phases("report"):
        summary = finish(req, result, reporter, done, ready.planned.machine, last,
                         interrupted=interrupted, nproc=ranks.nproc if ranks else 1)  # fmt: skip
    if warning := prediction_warning(summary, refits_profile=req.machine == "auto"):
        log.warning(warning)
    if warning := memory_warning(summary):
        log.warning(warning)
    return {**summary, **phase_summary(phases)}


def _step_hooks(
    stop: CtrlC,
    reporter: Reporter,
    skipped: list[int],
    ckpt: Checkpointer | None,
    start: int,
    phases: Phases,
) -> tuple[OnStep, OnSave]:
    """(on_step, on_finish): each step recorded if skipped and reported, Ctrl-C armed; and
    the final save."""

    def on_step(step: int, loss: float, lr: float, metrics: dict[str, Any]) -> bool:
        if metrics.get("skipped"):  # before the step's save: its checkpoint records it
            skipped.append(step)
        return stop.after_step(reporter, step, loss, lr, metrics)

    def final_save(step: int, read_state: ReadState) -> None:
        """After the last step, the engine still up: the state is read from its homes (RAM,
        NVMe, the GPU) only when there is a checkpoint to write (still whole, for now)."""
        stop.finishing()
        if ckpt and step > start:
            with phases("save"):
                ckpt.wait()
                ckpt.save(step, read_state, background=False)

    return on_step, final_save


@contextmanager
def _stopping(stop: CtrlC, ckpt: Checkpointer | None) -> Iterator[None]:
    """Ctrl-C's rules around the checkpoint's publish-or-cancel too: while an abort cancels the
    checkpoint in flight, a later Ctrl-C is ignored. With the handler restored first, one
    landing in the cancel's join interrupted it, and the process exited with the write still
    running on its thread: SIGABRT (1 of 10 double Ctrl-Cs in a loaded test run)."""
    with stop, _publish_or_cancel(ckpt):
        yield


@contextmanager
def _publish_or_cancel(ckpt: Checkpointer | None) -> Iterator[None]:
    """A run that fails: Ctrl-C (a second one) cancels the checkpoint in flight and ends with
    code 130; anything else publishes it first; a non-finite loss ends with code 1."""
    try:
        yield
    except KeyboardInterrupt:
        if ckpt:
            ckpt.cancel()
        raise StopRun(f"aborted{_kept(ckpt)}", code=130) from None
    except BaseException as exc:
        if ckpt and not isinstance(exc, StopRun):  # a checkpoint in flight is published first
            ckpt.wait()
        if isinstance(exc, NonFiniteLossError):
            raise StopRun(f"error: {exc}{_kept(ckpt)}", code=1) from None
        raise


def _evaluate(req: TrainRequest, eval_set: EvalSet, reporter: Reporter) -> Eval:
    """Every --eval-every global steps (else only after the last), --eval-batches of the set."""
    count = eval_set.batches(req.eval_batches)
    return Eval(every=req.eval_every or req.config.steps, batches=count,
                data=lambda: eval_set.iterate(count), on_eval=reporter.on_eval)  # fmt: skip


def _checkpointer(
    req: TrainRequest, spec: ModelSpec, optim: AdamWConfig, run_dir: RunDir, skipped: list[int]
) -> Checkpointer:
    """`skipped`: the global steps global clipping has skipped so far (on_step adds them)."""

    def state_text(step: int) -> str:
        return state_json(spec=spec, config=req.config, optim=optim, steps_done=step,
                          seed=req.seed, data=req.data, model_source=req.model,
                          tokenizer=req.tokenizer, shuffle=req.shuffle,
                          packing=req.packing, eval_fraction=req.eval_fraction,
                          skipped_steps=[s for s in skipped if s <= step])  # fmt: skip

    return Checkpointer(run_dir, StateWriter(spec, state_text, _companions(req)))


def _companions(req: TrainRequest) -> list[Path]:
    """What a checkpoint carries beside the model: the tokenizer's files (--tokenizer's, else
    the input model directory's, else the bundled corpus's) and the input model directory's
    generation_config.json."""
    model_dir = Path(req.model) if Path(req.model).is_dir() else None
    tokenizer = req.tokenizer or model_dir
    files = tokenizer_files(tokenizer) if tokenizer else []
    if not files and not req.data:
        files = tokenizer_files(tiny_tokenizer())
    generation = model_dir / "generation_config.json" if model_dir else None
    return files + ([generation] if generation and generation.is_file() else [])


def _kept(ckpt: Checkpointer | None) -> str:
    return f"; the last checkpoint is {ckpt.last}" if ckpt and ckpt.last else ""


def _dtype(name: str | None) -> torch.dtype | None:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, None: None}[name]
