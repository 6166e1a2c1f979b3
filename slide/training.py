"""What `slide train` does around the executor: check and resolve the request
(`slide.train_prepare`), open `--out` before any weight is touched, then run it
(`slide.fine_tune`: `slide.session.train` once, periodic checkpoints written at step boundaries
while the engine stays up, progress, metrics, the trace and the Gantt chart).

Checkpoints follow `slide.checkpoints` (complete or absent, published by one rename, the
previous one removed only after); what they record and how `--resume` checks it is
`slide.resume`. Ctrl-C finishes the step in flight, publishes a checkpoint and ends with code
130; a second Ctrl-C aborts at once, leaving the last published checkpoint as it was
(`slide.ctrl_c`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from executor.phases import Phases, since_command_start
from executor.ranks import Ranks
from slide.checkpoints import RunDir
from slide.errors import UserError
from slide.fileio import write_atomic
from slide.fine_tune import fine_tune
from slide.resume import Resumed
from slide.run_config import to_toml
from slide.train_prepare import device_of, prepare, resolve_machine
from slide.train_request import TrainRequest
from slide.weights import initial_weights
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

log = logging.getLogger(__name__)
CONFIG_FILE = "config.toml"  # in OUT: the run's resolved flags


def run_training(req: TrainRequest, ranks: Ranks | None = None) -> dict[str, Any]:
    """Train as `req` says; the summary's `interrupted` tells whether Ctrl-C ended it, its
    `startup` and `shutdown` where the wall time went before the first step and after it.
    Data parallel (`ranks`): every rank reads the data and `--resume`; rank 0 alone writes
    (progress, metrics, traces, checkpoints), the others run with no outputs."""
    phases = Phases()
    phases.add("imports", since_command_start())  # from the command to here
    if ranks is not None and not ranks.is_main:
        req = replace(req, out=None, metrics=None, tensorboard=None, trace=None,
                      save_trace=None, gantt=None, progress=False)  # fmt: skip
    if ranks is not None and req.machine == "auto" and device_of(req).type == "cuda":
        # rank 0 measures the host alone (N ranks at once would each see a share of its
        # memory and link), the others then read the profile it cached
        if ranks.is_main:
            resolve_machine(req, device_of(req))
        ranks.barrier()
    ready = prepare(req, phases, ranks.nproc if ranks else 1)
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
        return fine_tune(ready, weights, run_dir, phases, request, ranks)
    finally:
        if run_dir is not None:
            run_dir.close()


def check_training(req: TrainRequest, nproc: int) -> None:
    """Refuse, before any rank starts, what `nproc` ranks would refuse (`slide.launch`)."""
    ready = prepare(req, Phases(), nproc)
    if ready.device.type == "cuda" and nproc > torch.cuda.device_count():
        raise UserError(f"--nproc {nproc}: this host has {torch.cuda.device_count()} CUDA "
                        "devices (one per rank)")  # fmt: skip
    if req.out:
        at = (ready.resumed.directory, ready.resumed.steps_done) if ready.resumed else None
        RunDir.check(req.out, keep=req.keep, overwrite=req.overwrite, resumed=at)


def _open_out(req: TrainRequest, resumed: Resumed | None) -> RunDir | None:
    if not req.out:
        return None
    at = (resumed.directory, resumed.steps_done) if resumed else None
    run_dir = RunDir.open(req.out, keep=req.keep, overwrite=req.overwrite, resumed=at)
    if req.run_config is not None:
        write_atomic(run_dir.root / CONFIG_FILE, to_toml(req.run_config))
    return run_dir


def _initial(req: TrainRequest, spec: ModelSpec) -> Mapping[str, torch.Tensor]:
    return initial_weights(spec, req.model if Path(req.model).is_dir() else None, req.seed)


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
