"""What `slide train` does around the executor: resolve inputs, check data, resume state and
`--out` before any weight is touched, run `slide.session.train` once (periodic checkpoints are
written at step boundaries while the engine stays up), report progress, write metrics, the
trace and the Gantt chart.

Checkpoints follow `slide.checkpoints` (complete or absent, published by one rename, the
previous one removed only after); what they record and how `--resume` checks it is
`slide.resume`. Ctrl-C finishes the step in flight, publishes a checkpoint and ends with code
130; a second Ctrl-C aborts at once, leaving the last published checkpoint as it was.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from executor import host_adam
from executor.adam import AdamWConfig
from executor.interrupts import AbortRun
from executor.phases import Phases, since_process_start
from executor.ranks import Ranks
from executor.run import Eval, InfeasiblePlanError, NonFiniteLossError, ReadState
from slide.calibration.auto_machine import refit_key
from slide.chat_data import LengthLimit
from slide.checkpoints import RunDir
from slide.data import TokenStream, batches, load_token_stream, sample_count
from slide.errors import StopRun, UserError
from slide.eval_data import EvalSet, held_out, training_windows
from slide.fileio import write_atomic
from slide.resume import Resumed, read_checkpoint, state_json
from slide.run_config import to_toml
from slide.saving import Checkpointer, StateWriter
from slide.session import check_feasible, plan_run, train
from slide.tokenizer import CORPUS, build_tiny_tokenizer, tokenizer_files
from slide.train_report import Reporter, finish, phase_summary, prediction_warning
from slide.weights import initial_weights
from slide_ir.planning.planner import Plan, plan_from_json
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model

log = logging.getLogger(__name__)
TINY_TOKENIZER = Path.home() / ".cache" / "slide" / "tiny-tokenizer"
CONFIG_FILE = "config.toml"  # in OUT: the run's resolved flags


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    model: str
    machine: str
    config: TrainConfig
    ram_gb: float | None = None
    nvme: int | None = None
    nvme_dirs: tuple[str, ...] = ()
    data: str | None = None
    tokenizer: str | None = None
    data_cache: str | None = None  # token caches' directory [~/.cache/slide/tokens]
    truncation: str = "truncate"  # chat data: conversations longer than seq, cut or dropped
    eval_data: str | None = None  # the eval set's file (any --data format)
    eval_fraction: float | None = None  # or this fraction of the data's windows, held out
    eval_every: int | None = None  # steps between evals (None: only after the last step)
    eval_batches: int = 16  # batches an eval reads at most (0: the whole eval set)
    packing: str = "stream"  # `slide.packing.PACKING`: one stream in windows, or documents apart
    shuffle: bool = True
    seed: int = 0
    device: str | None = None
    dtype: str | None = None
    lr: float = 1e-5
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    out: str | None = None
    overwrite: bool = False
    save_every: int = 0
    keep: int = 2
    resume: str | None = None
    extend_schedule: bool = False
    metrics: str | None = None
    tensorboard: str | None = None  # a directory for the metrics as TensorBoard scalars
    plan_file: str | None = None  # a saved plan: its model, machine and config (but steps) win
    trace: str | None = None
    # the steps --trace/--gantt/--save-trace show; None: `executor.recording.default_trace_steps`
    trace_steps: tuple[int, int] | None = None
    log_every: int = 10  # metrics add tokens/s and lane busy shares over every N steps
    max_skipped_steps: int = 10  # global clipping: non-finite steps in a row that stop the run
    gantt: str | None = None
    save_trace: str | None = None  # the measured Trace in Slide's format (for compare-trace)
    progress: bool = True
    # after the first steady steps, re-fit the profile to the measured lanes and move to the
    # placement the search then prefers (CUDA runs planned here, not from a saved plan)
    replan: bool = True
    # said once (rank 0) when every check has passed, before the weights are touched: what the
    # run would otherwise do without a word (`slide.commands.train_inputs.notices`)
    notices: tuple[str, ...] = ()
    # the flags the run resolved, by config key (`slide.run_config`): written to OUT/config.toml
    # and the first metrics line, so `slide train --config OUT/config.toml` repeats the run
    run_config: dict[str, Any] | None = None


def run_training(req: TrainRequest, ranks: Ranks | None = None) -> dict[str, Any]:
    """Train as `req` says; the summary's `interrupted` tells whether Ctrl-C ended it, its
    `startup` and `shutdown` where the wall time went before the first step and after it.
    Data parallel (`ranks`): every rank reads the data and `--resume`; rank 0 alone writes
    (progress, metrics, traces, checkpoints), the others run with no outputs."""
    phases = Phases()
    phases.add("imports", since_process_start())  # from the command to here
    if ranks is not None and not ranks.is_main:
        req = replace(req, out=None, metrics=None, tensorboard=None, trace=None,
                      save_trace=None, gantt=None, progress=False)  # fmt: skip
    if ranks is not None and req.machine == "auto" and device_of(req).type == "cuda":
        # rank 0 measures the host alone (N ranks at once would each see a share of its
        # memory and link), the others then read the profile it cached
        if ranks.is_main:
            resolve_machine(req, device_of(req))
        ranks.barrier()
    ready = _prepare(req, phases, ranks.nproc if ranks else 1)
    req, resumed = ready.req, ready.resumed
    for notice in req.notices:
        log.warning(notice)
    with phases("weights source"):
        weights = resumed.weights if resumed else _initial(req, ready.planned.model)
    with phases("output directory"):
        run_dir = _open_out(req, resumed)
    replan = req.replan and ranks is None and ready.saved is None and ready.device.type == "cuda"
    request = ready.remaining if replan else None
    try:
        return _fine_tune(req, ready.planned, ready.optim, ready.data, weights, resumed, run_dir,
                    phases, request, ranks, ready.eval_set)  # fmt: skip
    finally:
        if run_dir is not None:
            run_dir.close()


def check_training(req: TrainRequest, nproc: int) -> None:
    """Refuse, before any rank starts, what `nproc` ranks would refuse (`slide.launch`)."""
    ready = _prepare(req, Phases(), nproc)
    if ready.device.type == "cuda" and nproc > torch.cuda.device_count():
        raise UserError(f"--nproc {nproc}: this host has {torch.cuda.device_count()} CUDA "
                        "devices (one per rank)")  # fmt: skip
    if req.out:
        at = (ready.resumed.directory, ready.resumed.steps_done) if ready.resumed else None
        RunDir.check(req.out, keep=req.keep, overwrite=req.overwrite, resumed=at)


def device_of(req: TrainRequest) -> torch.device:
    device = torch.device(req.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible here (use --device cpu)")
    return device


@dataclass(frozen=True, kw_only=True)
class _Ready:
    """A request checked and resolved, nothing of the model built yet."""

    req: TrainRequest  # a saved plan's config in place of the command line's
    device: torch.device
    saved: Plan | None
    optim: AdamWConfig
    resumed: Resumed | None
    remaining: TrainConfig  # the steps still to run (the global batch)
    planned: Plan  # data parallel: one rank's single-GPU plan, at batch / nproc
    data: Iterator[tuple[torch.Tensor, ...]]
    eval_set: EvalSet | None  # what --eval-data or --eval-fraction evaluates on


def _prepare(req: TrainRequest, phases: Phases, nproc: int) -> _Ready:
    """Everything the user can get wrong, checked before any weight is touched."""
    if req.log_every < 1:
        raise UserError(f"--log-every must be a step count >= 1, got {req.log_every}")
    if req.max_skipped_steps < 1:
        raise UserError(
            f"--max-skipped-steps must be a step count >= 1, got {req.max_skipped_steps}"
        )
    if req.save_every < 0:
        raise UserError(
            f"--save-every must be 0 (only at the end) or a step count, got {req.save_every}"
        )
    if nproc > 1 and (req.eval_data is not None or req.eval_fraction is not None):
        raise UserError(f"{nproc} ranks: the eval loss runs on one process; drop "
                        "--eval-data/--eval-fraction, or run one rank")  # fmt: skip
    device = device_of(req)
    with phases("model spec"):
        saved = _saved_plan(req.plan_file)
        spec = saved.model if saved else load_model(req.model)
    host_adam.prebuild()  # a fresh host compiles it (7 s on the H200) beside the GPU probes
    with phases("machine"):
        per_gpu = req.config.batch // nproc if nproc >= 1 else req.config.batch  # checked later
        shape = refit_key(spec.name, per_gpu, req.config.seq)
        machine = saved.machine if saved else resolve_machine(req, device, shape)
    # a saved plan fixes the configuration but for the steps (the request's are the plan's
    # unless --steps said otherwise: `slide.commands.train_inputs`)
    req = replace(
        req, config=replace(saved.config, steps=req.config.steps) if saved else req.config
    )
    optim = AdamWConfig(
        lr=req.lr,
        schedule=req.lr_schedule,
        warmup_steps=req.warmup_steps,
        weight_decay=req.weight_decay,
        betas=req.betas,
        eps=req.eps,
    )
    with phases("resume"):
        resumed = (
            read_checkpoint(req.resume, spec, req.config, optim,
                            extend_schedule=req.extend_schedule)
            if req.resume
            else None
        )  # fmt: skip
    start = resumed.steps_done if resumed else 0
    optim = replace(optim, total_steps=resumed.total_steps if resumed else req.config.steps)
    remaining = replace(req.config, steps=req.config.steps - start)
    with phases("plan"):
        planned = plan_run(saved, spec, machine, remaining, nproc)
        try:
            if nproc == 1:  # N ranks: checked sharded (`plan_run`), and again by each rank
                check_feasible(planned, device)
        except InfeasiblePlanError as exc:
            raise UserError(str(exc)) from None
    with phases("data"):
        data, eval_set = _data(req, spec, start)
    return _Ready(req=req, device=device, saved=saved, optim=optim, resumed=resumed,
                  remaining=remaining, planned=planned, data=data, eval_set=eval_set)  # fmt: skip


def _open_out(req: TrainRequest, resumed: Resumed | None) -> RunDir | None:
    if not req.out:
        return None
    at = (resumed.directory, resumed.steps_done) if resumed else None
    run_dir = RunDir.open(req.out, keep=req.keep, overwrite=req.overwrite, resumed=at)
    if req.run_config is not None:
        write_atomic(run_dir.root / CONFIG_FILE, to_toml(req.run_config))
    return run_dir


def _fine_tune(
    req: TrainRequest,
    planned: Plan,
    optim: AdamWConfig,
    data: Iterator[tuple[torch.Tensor, ...]],
    weights: Mapping[str, torch.Tensor],
    resumed: Resumed | None,
    run_dir: RunDir | None,
    phases: Phases,
    replan_request: TrainConfig | None,
    ranks: Ranks | None,
    eval_set: EvalSet | None = None,
) -> dict[str, Any]:
    start = resumed.steps_done if resumed else 0
    # the global steps global clipping skipped, in order: a background save reads it meanwhile
    skipped = list(resumed.skipped_steps if resumed else ())
    ckpt = _checkpointer(req, planned.model, optim, run_dir, skipped) if run_dir else None
    reporter = Reporter(req, total=req.config.steps, start=start, phases=phases)
    evaluate = _evaluate(req, eval_set, reporter) if eval_set else None
    stop = _CtrlC()
    result = None

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

    try:
        with stop:
            result = train(
                planned.model,
                planned.machine,
                replace(planned.config, steps=req.config.steps - start, batch=req.config.batch),
                initial_state=weights,
                planned=planned,
                batches=data,
                optim=optim,
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
                documents=req.packing == "documents",
            )
            stop.finishing()
            done = start + result.steps_done
            if ckpt:
                ckpt.wait()
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
    finally:
        reporter.close()
    last = ckpt.last if ckpt else None
    with phases("report"):
        summary = finish(req, result, reporter, done, planned.machine, last,
                         interrupted=stop.requested, nproc=ranks.nproc if ranks else 1)  # fmt: skip
    if warning := prediction_warning(summary, refits_profile=req.machine == "auto"):
        log.warning(warning)
    return {**summary, **phase_summary(phases)}


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
        files = tokenizer_files(_tiny_tokenizer())
    generation = model_dir / "generation_config.json" if model_dir else None
    return files + ([generation] if generation and generation.is_file() else [])


def _kept(ckpt: Checkpointer | None) -> str:
    return f"; the last checkpoint is {ckpt.last}" if ckpt and ckpt.last else ""


def _dtype(name: str | None) -> torch.dtype | None:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, None: None}[name]


def _initial(req: TrainRequest, spec: ModelSpec) -> Mapping[str, torch.Tensor]:
    return initial_weights(spec, req.model if Path(req.model).is_dir() else None, req.seed)


def _data(
    req: TrainRequest, spec: ModelSpec, start: int
) -> tuple[Iterator[tuple[torch.Tensor, ...]], EvalSet | None]:
    """The run's batches from step `start` on, and its eval set (`slide.eval_data`); the
    first batch is pulled now, so bad data fails before the model is built."""
    config, stream, source = req.config, _token_stream(req), req.data or str(CORPUS)
    train_windows, eval_set = None, None
    if req.eval_fraction is not None:
        windows = sample_count(stream, config.seq, req.packing, source)
        held = held_out(windows, req.eval_fraction, req.seed, batch=config.batch)
        train_windows = training_windows(windows, held)
        eval_set = EvalSet.of(stream, held, batch=config.batch, seq=config.seq,
                              vocab_size=spec.vocab_size, source=source,
                              packing=req.packing)  # fmt: skip
    elif req.eval_data is not None:
        eval_stream = _token_stream(req, req.eval_data)
        eval_set = EvalSet.of(eval_stream, None, batch=config.batch, seq=config.seq,
                              vocab_size=spec.vocab_size, source=req.eval_data,
                              packing=req.packing)  # fmt: skip
    it = batches(
        stream,
        batch=config.batch,
        seq=config.seq,
        count=config.steps * config.grad_accum,
        start=start * config.grad_accum,
        shuffle=req.shuffle,
        seed=req.seed,
        vocab_size=spec.vocab_size,
        source=source,
        packing=req.packing,
        samples=train_windows,
    )
    first = next(it)
    return itertools.chain([first], it), eval_set


class _CtrlC:
    """SIGINT while training: the first asks the run to stop after the step in flight (and
    save); a second, or one before the first step has finished, aborts (`AbortRun`, which the
    step loop lets through), and later ones are ignored while the abort unwinds."""

    def __init__(self) -> None:
        self.requested = False
        self._armed = self._aborting = False
        self._previous: Any = None

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def after_step(self, reporter: Reporter, *step: Any) -> bool:
        """on_step: report the step; from now on a Ctrl-C stops after the step in flight."""
        reporter.on_step(*step)
        self._armed = True
        return self.requested

    def finishing(self) -> None:
        """The steps are over: from here a Ctrl-C aborts the final save."""
        self._armed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._aborting:  # the abort is unwinding (lanes joined, files closed): let it
            return
        if self.requested or not self._armed:
            self._aborting = True
            raise AbortRun
        self.requested = True
        log.warning(
            "interrupted: finishing the step in flight, then saving (Ctrl-C again to abort)"
        )


def _saved_plan(path: str | None) -> Plan | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise UserError(f"plan file {path} does not exist")
    try:
        return plan_from_json(Path(path).read_text(encoding="utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError (a binary file) too
        raise UserError(f"plan file {path} is not a plan `slide plan --out` wrote: {exc}") from None


def resolve_machine(req: TrainRequest, device: torch.device, shape: str | None = None) -> Machine:
    """`auto`: this host, measured once and cached (`slide.calibration.auto_machine`), re-fit
    to earlier runs of `shape`; else a catalog name or a .toml profile. `--ram-gb` and `--nvme`
    override either."""
    from slide.calibration.auto_machine import resolve

    return resolve(req.machine, device, ram_gb=req.ram_gb, nvme=req.nvme, shape=shape)


def _token_stream(req: TrainRequest, path: str | None = None) -> TokenStream:
    """The run's tokens (or `path`'s: the eval data), from their cache (prepared now, with a
    progress bar, if missing)."""
    return load_token_stream(path or req.data or CORPUS, tokenizer_dir=_data_tokenizer(req),
                             cache_dir=req.data_cache, progress=req.progress,
                             limit=LengthLimit(req.config.seq, req.truncation))  # fmt: skip


def _data_tokenizer(req: TrainRequest) -> str | Path | None:
    """The tokenizer of the run's data: --tokenizer, else the bundled corpus's own."""
    return req.tokenizer or (None if req.data else _tiny_tokenizer())


def _tiny_tokenizer() -> Path:
    """The bundled corpus's tokenizer, built once per user: aside, then renamed into place
    (the ranks torchrun starts together may all build it; the first rename wins)."""
    if (TINY_TOKENIZER / "tokenizer.json").is_file():
        return TINY_TOKENIZER
    aside = TINY_TOKENIZER.with_name(f".tmp-{TINY_TOKENIZER.name}-{os.getpid()}")
    build_tiny_tokenizer(aside)
    try:
        aside.rename(TINY_TOKENIZER)
    except OSError:  # another process's is in place
        shutil.rmtree(aside, ignore_errors=True)
    return TINY_TOKENIZER


def demo_finetune(out: Path) -> str:
    """The README demo's real run: tiny-llama, a few dozen steps on the bundled corpus."""
    out.mkdir(parents=True, exist_ok=True)
    req = TrainRequest(
        model="tiny-llama",
        machine="auto",
        config=TrainConfig(batch=8, seq=128, steps=40),
        lr=3e-3,
        out=str(out / "checkpoint"),
        overwrite=True,
        metrics=str(out / "metrics.jsonl"),
        trace=str(out / "trace.json"),
        gantt=str(out / "gantt.png"),
    )
    summary = run_training(req)
    return (
        f"fine-tuned tiny-llama for {summary['steps_done']} steps: loss {summary['loss_first']:.3f}"
        f" -> {summary['loss_last']:.3f}; measured Gantt {out / 'gantt.png'}, checkpoint {req.out}"
    )
