"""Everything in a `slide train` request the user can get wrong, checked before any weight is
touched: the options, the device, a saved plan, the machine, `--resume`'s checkpoint, that the
plan fits, and the data's first batch. What comes out (`Prepared`) is the run resolved, nothing
of the model built yet; `slide.training` runs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from executor import host_adam
from executor.adam import AdamWConfig
from executor.phases import Phases
from executor.run import InfeasiblePlanError
from slide import preflight
from slide.calibration.auto_machine import refit_key
from slide.errors import UserError
from slide.eval_data import EvalSet
from slide.resume import Resumed, read_checkpoint
from slide.session import check_feasible, plan_run
from slide.train_data import training_data
from slide.train_request import TrainRequest
from slide_ir.planning.planner import Plan, plan_from_json
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model_catalog import load_model


def device_of(req: TrainRequest) -> torch.device:
    device = torch.device(req.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible here (use --device cpu)")
    return device


@dataclass(frozen=True, kw_only=True)
class Prepared:
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


def prepare(req: TrainRequest, phases: Phases, nproc: int) -> Prepared:
    """Everything the user can get wrong, checked before any weight is touched."""
    _check_options(req, nproc)
    device = device_of(req)
    with phases("model spec"):
        saved = _saved_plan(req.plan_file)
        spec = saved.model if saved else load_model(req.model)
    host_adam.prebuild()  # a fresh host compiles it (7 s on the H200) beside the GPU probes
    with phases("machine"):
        per_gpu = req.config.batch // nproc if nproc >= 1 else req.config.batch  # checked later
        shape = refit_key(spec.name, per_gpu, req.config.seq)
        machine = saved.machine if saved else resolve_machine(req, device, shape)
        preflight.gpu_memory(req.config.gpu_memory_gb, machine)
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
        data, eval_set = training_data(req, spec, start)
    return Prepared(req=req, device=device, saved=saved, optim=optim, resumed=resumed,
                    remaining=remaining, planned=planned, data=data, eval_set=eval_set)  # fmt: skip


def _check_options(req: TrainRequest, nproc: int) -> None:
    """The options no later stage checks: step counts, and the eval set on one rank only."""
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
    to earlier runs of `shape`, each `--nvme-dir`'s drive measured; else a catalog name or a
    .toml profile. `--ram-gb` and `--nvme` override either."""
    from slide.calibration.auto_machine import resolve

    return resolve(req.machine, device, ram_gb=req.ram_gb, nvme=req.nvme, shape=shape,
                   nvme_dirs=req.nvme_dirs)  # fmt: skip
