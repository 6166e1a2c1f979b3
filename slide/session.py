"""The controller: plan -> check -> Program -> run k steps -> re-fit -> re-plan -> run on.

Every decision about a run is made here or in the planner, never inside the executor: which
plan (the caller's, or the planner's for the request), whether it fits the machine's ledger and
the real device, which graphs its passes need (the Program, `slide_ir.planning.programs`), how
many CPU threads its update lane gets, and, for a run that asked for it (`replan_request`),
whether to move to another placement after its first steady steps: the executor measures, the
re-fit (`slide_ir.planning.refit`) prices, and the move is the executor's stop-and-resume
(`Engine.move`) into the new plan's Program. `slide train` and the data-parallel launcher call
`train`; nothing else plans a run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

import torch

from executor.adam import AdamWConfig
from executor.loop import OnSave, OnStep
from executor.phases import Phases
from executor.ranks import Ranks
from executor.recording import default_trace_steps
from executor.run import Engine, Eval, Hooks, InfeasiblePlanError, Options, Start, TrainResult
from slide.calibration.auto_machine import refit_cache, refit_key
from slide.errors import UserError
from slide.gpu_cap import capped
from slide_ir.planning import refit
from slide_ir.planning.data_parallel import check_nproc, plan_data_parallel, shard_plan
from slide_ir.planning.planner import Plan, plan
from slide_ir.planning.programs import graph_config, pass_plan, program
from slide_ir.program import Program
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.hardware_parts import default_optimizer_threads as threads_rule
from slide_ir.specs.model import ModelSpec

log = logging.getLogger("slide.session")

REPLAN_AFTER = 6  # steps before the placement check: warm-up + 5 steady steps
# A move extracts the state, frees the old engine and builds the new one: on the H200 a 3B move
# (llama-3.2-3b batch 16) took 19.1 s against that run's 8.7 s of buffers and state set-up.
MOVE_COST_PER_SETUP = 2.2


def train(
    model_spec: ModelSpec,
    machine: Machine,
    config: TrainConfig,
    *,
    initial_state: Mapping[str, torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, ...]],
    optim: AdamWConfig | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    on_step: OnStep | None = None,
    initial_optim_state: Mapping[str, torch.Tensor] | None = None,
    start_step: int = 0,
    skipped_steps: Iterable[int] = (),
    nvme_dir: str | Path | Iterable[str | Path] | None = None,
    planned: Plan | None = None,
    save_every: int = 0,
    on_save: OnSave | None = None,
    trace_steps: tuple[int, int] | None = None,
    log_every: int = 10,
    max_skipped_steps: int = 10,
    phases: Phases | None = None,
    on_finish: OnSave | None = None,
    hand_back: bool = True,
    replan_request: TrainConfig | None = None,
    refit_profile: bool = False,
    ranks: Ranks | None = None,
    evaluate: Eval | None = None,
) -> TrainResult:
    """Fine-tune all parameters for `config.steps` optimizer steps (`executor.run` says what
    each hook and option does). `planned`: the plan to run (else the planner's for `config`;
    data parallel: one rank's single-GPU plan at batch / N, which the Program shards).
    `replan_request`: the configuration `planned` was planned from, its "auto" choices
    unresolved: after the first `REPLAN_AFTER` steps the run re-fits the machine profile to its
    measured lanes and, where the placement search then chooses a placement predicted >= 3%
    faster, moves into it (`meta["replan"]` says what was decided and why). The move holds the
    old and the new engine's host memory at once, so it is made only when the machine's RAM
    holds both, and only when the steps left are predicted to save more than the move costs
    (`MOVE_COST_PER_SETUP` times this run's set-up). `refit_profile`: the re-fit rates are
    written back into this host's cached `--machine auto` profile, for the next run to plan
    with from its first step. `evaluate`: the eval loss every N steps and after the last, on
    eval passes planned beside the training ones (one process only). `skipped_steps`: the
    global steps up to `start_step` that global clipping skipped (a resume's, from its
    checkpoint): Adam's bias correction counts only the updates made."""
    if ranks is not None and (replan_request is not None or evaluate is not None):
        raise ValueError("re-planning and evals are for one process: data-parallel ranks "
                         "run neither")  # fmt: skip
    dev, dtype = _device(device, dtype)
    p = pass_plan(planned or _plan(model_spec, machine, config, ranks), _graph_steps(config))
    check_feasible(p, dev) if ranks is None else check_ranks_fit(p, ranks, dev)
    checked_after = REPLAN_AFTER if replan_request is not None else None
    optim = optim or AdamWConfig()
    options = Options(
        device=dev,
        dtype=dtype,
        optim=optim,
        nvme_dir=nvme_dir,
        trace_steps=trace_steps or default_trace_steps(config.steps, checked_after),
        log_every=log_every,
        max_skipped_steps=max_skipped_steps,
        steady_from=steady_from(config.steps, checked_after),
        hand_back=hand_back,
        ranks=ranks,
        phases=phases or Phases(),
    )
    start = Start(
        weights=initial_state,
        moments=initial_optim_state,
        step=start_step,
        total_steps=optim.total_steps or (start_step + config.steps),
        skipped=frozenset(skipped_steps),
    )
    hooks = Hooks(on_step=on_step, on_save=on_save, save_every=save_every, on_finish=on_finish,
                  evaluate=evaluate)  # fmt: skip
    with capped(dev, p.config.gpu_memory_gb):
        result, checked = _run(p, config.steps, start, batches, hooks, options, replan_request)
    if checked is not None:
        result.meta["replan"] = checked.summary()
        if refit_profile and checked.factors:
            refit_cache(dev, checked.factors, refit_key(p.model.name, p.config.batch, p.config.seq))
    return result


def _run(
    p: Plan,
    steps: int,
    start: Start,
    batches: Iterable[tuple[torch.Tensor, ...]],
    hooks: Hooks,
    options: Options,
    replan_request: TrainConfig | None,
) -> tuple[TrainResult, refit.Replanned | None]:
    """Run `steps` steps of `p`'s Program, stopping at `REPLAN_AFTER` to check the placement
    when `replan_request` asks for it (the check may move the run into a new Program), and
    at each eval step. An out-of-memory error carries the ledger's view of the plan."""
    checking = replan_request is not None and steps > REPLAN_AFTER
    stops = [REPLAN_AFTER, steps] if checking else [steps]
    if hooks.evaluate is not None:
        stops = sorted({*stops, *eval_stops(hooks.evaluate, start.step, steps)})
    eval_batches = hooks.evaluate.batches if hooks.evaluate is not None else 0
    checked: refit.Replanned | None = None
    try:
        first = _program(p, stops, 0, options.device, options.ranks, eval_batches)
        with Engine(first, start, batches, steps, hooks, options) as engine:
            if checking:
                assert replan_request is not None
                engine.advance(REPLAN_AFTER)
                if engine.done == REPLAN_AFTER and not engine.stopped:
                    checked = _check_placement(engine, p, replan_request, stops, options.device,
                                               eval_batches)  # fmt: skip
            engine.advance(steps)
            return engine.finish(), checked
    except torch.OutOfMemoryError as exc:
        exc.add_note(_ledger_note(p))
        raise


def _graph_steps(config: TrainConfig) -> int:
    return graph_config(config).steps


def _device(
    device: str | torch.device | None, dtype: torch.dtype | None
) -> tuple[torch.device, torch.dtype]:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev, dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)


def plan_run(
    saved: Plan | None, spec: ModelSpec, machine: Machine, config: TrainConfig, nproc: int
) -> Plan:
    """The plan `slide train` runs: a saved one, or the planner's; with `nproc` ranks, one
    rank's (at batch / nproc, its state sharded when the Program is made), checked to fit N
    ranks."""
    if nproc == 1:
        return (
            pass_plan(saved, _graph_steps(config))
            if saved
            else plan(spec, machine, graph_config(config))
        )
    if saved:
        raise UserError("--plan runs a single-GPU plan: drop --plan, or --nproc")
    dp = plan_data_parallel(spec, machine, graph_config(config), nproc)
    for tier, short in dp.overflows():
        where = "each rank's GPU" if tier == "gpu" else f"the host's {tier}"
        raise UserError(f"{nproc} ranks do not fit {machine.name}: {where} needs "
                        f"{short / 2**30:.2f} GiB more than its "
                        f"{dp.capacity_bytes(tier) / 2**30:.2f} GiB")  # fmt: skip
    return dp.base


def _plan(spec: ModelSpec, machine: Machine, config: TrainConfig, ranks: Ranks | None) -> Plan:
    """The planner's plan of `config`; data parallel: one rank's, at the rank's batch."""
    if ranks is None:
        return plan(spec, machine, graph_config(config))
    check_nproc(machine, config, ranks.nproc)
    rank_config = replace(config, batch=config.batch // ranks.nproc)
    return plan(spec, machine, graph_config(rank_config), nproc=ranks.nproc)


def eval_stops(evaluate: Eval, start_step: int, steps: int) -> list[int]:
    """The steps of this run (counted from its first) after which an eval is due: every
    `every`-th global step, and the last."""
    first = evaluate.next_stop(start_step) - start_step
    return [*range(first, steps, evaluate.every), steps]


def _program(
    p: Plan,
    stops: list[int],
    done: int,
    dev: torch.device,
    ranks: Ranks | None,
    eval_batches: int = 0,
) -> Program:
    nproc, rank = (ranks.nproc, ranks.rank) if ranks is not None else (1, 0)
    threads = optimizer_threads(p.config, nproc)
    return program(p, stops, done=done, cpu_threads=threads, nproc=nproc, rank=rank,
                   predicted=dev.type == "cuda", eval_batches=eval_batches)  # fmt: skip


def _check_placement(
    engine: Engine,
    p: Plan,
    request: TrainConfig,
    stops: list[int],
    dev: torch.device,
    eval_batches: int,
) -> refit.Replanned:
    """After the check's stretch: re-fit, re-plan, and move when it pays (see `train`)."""
    steps = stops[-1]
    measured = engine.measured()
    ran = pass_plan(p, REPLAN_AFTER)
    if request.speculate == "auto" and request.deferred_updates:  # the share seen, not assumed
        request = replace(request, rollback_share=measured.clipped_share)
    check = refit.replan(ran, request, measured.busy, measured.steps, measured.by_kind,
                         measured.clipped)  # fmt: skip
    if check.plan is not None:
        move_s = MOVE_COST_PER_SETUP * engine.setup_seconds()
        keep = _reason_to_stay(ran, check, steps - engine.done, move_s)
        if keep:
            check = replace(check, plan=None, reason=f"{check.reason}, but {keep}: kept")
    if check.plan is None:
        log.info("re-plan: kept the running placement (%s)", check.reason)
        return check
    new_p = pass_plan(check.plan, p.config.steps)
    check_feasible(new_p, dev)
    log.warning("re-plan after step %d: %s", engine.start.step + engine.done, check.reason)
    engine.move(_program(new_p, stops, engine.done, dev, None, eval_batches))
    return check


def steady_from(steps: int, checked_after: int | None) -> int:
    """The first step the summary's tokens/s counts: the second, or, when the run checks its
    placement after step `checked_after` and goes on for two more, the one after the step that
    paid for the check (and for a move, if it made one)."""
    if checked_after is not None and steps >= checked_after + 2:
        return checked_after + 2
    return 2


def _reason_to_stay(ran: Plan, check: refit.Replanned, steps_left: int, move_s: float) -> str:
    """Why the run keeps its placement though the search chose another ("" to move): the
    move needs the old and the new engine's host memory at once, and it must pay for itself
    in the steps left."""
    assert check.plan is not None
    need = ran.ledger.peak_bytes("cpu") + check.plan.ledger.peak_bytes("cpu")
    if need > ran.machine.ram_bytes:
        return (f"moving the state needs {need / 2**30:.1f} GiB of RAM "
                f"({ran.machine.ram_bytes / 2**30:.1f} GiB)")  # fmt: skip
    saved = steps_left * (check.running_s - check.best_s)
    if saved < move_s:
        return (f"the {steps_left} steps left would save {saved:.1f} s, "
                f"the move costs about {move_s:.1f} s")  # fmt: skip
    return ""


def check_ranks_fit(p: Plan, ranks: Ranks, dev: torch.device) -> None:
    """Each rank's GPU and the host's RAM and NVMe hold N ranks' shares (in CPU mode the
    host holds every rank's "GPU" part too); the device's check is the executor's."""
    dp = shard_plan(p, ranks.nproc, ranks.rank)
    over = dp.overflows()
    if dev.type == "cpu":
        need = dp.host_bytes("gpu") + dp.host_bytes("cpu")
        over = [("cpu", need - dp.capacity_bytes("cpu"))] if need > dp.capacity_bytes("cpu") else []
    if over:
        tier, short = over[0]
        where = "each rank's GPU" if tier == "gpu" else f"the host's {tier}"
        raise InfeasiblePlanError(
            f"{ranks.nproc} ranks do not fit {p.machine.name}: {where} needs "
            f"{short / 2**30:.2f} GiB more than its {dp.capacity_bytes(tier) / 2**30:.2f} GiB"
        )


def _ledger_note(p: Plan) -> str:
    parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in p.ledger.breakdown("gpu").items())
    return (
        f"the ledger planned {p.ledger.peak_bytes('gpu') / 2**30:.2f} GiB on the GPU ({parts} GiB)"
    )


def check_feasible(p: Plan, dev: torch.device) -> None:
    """Refuse before allocating anything: the ledger against the machine (the executor then
    checks the Program's GPU bytes against the real device)."""
    if dev.type == "cpu":
        _check_fits_host(p)
        return
    over = p.ledger.overflows()
    if over:
        tier, short = over[0]
        raise InfeasiblePlanError(
            f"plan does not fit {p.machine.name}: {tier} needs "
            f"{p.ledger.peak_bytes(tier) / 2**30:.2f} GiB, {short / 2**30:.2f} GiB more than "
            f"its {p.ledger.capacity_bytes(tier) / 2**30:.2f} GiB"
        )
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = p.ledger.peak_bytes("cpu")
    if need > ram:  # a warning only: some VMs report a MemTotal that grows as memory is used
        log.warning(
            "plan needs %.2f GiB of host RAM; this host reports %.2f GiB",
            need / 2**30,
            ram / 2**30,
        )


def _check_fits_host(p: Plan) -> None:
    """CPU mode: the GPU's share of the plan lives in host memory beside the host's own."""
    parts = {tier: p.ledger.peak_bytes(tier) for tier in ("gpu", "cpu")}
    need, have = sum(parts.values()), p.ledger.capacity_bytes("cpu")
    if need > have:
        raise InfeasiblePlanError(
            f"plan does not fit this host's memory: on --device cpu it needs "
            f"{need / 2**30:.2f} GiB (the GPU's part {parts['gpu'] / 2**30:.2f} + the host's "
            f"{parts['cpu'] / 2**30:.2f}), {(need - have) / 2**30:.2f} GiB more than the "
            f"{have / 2**30:.2f} GiB usable here; try a smaller --model, --batch or --seq"
        )


def optimizer_threads(config: TrainConfig, nproc: int = 1) -> int:
    """Intra-op threads for the CPU AdamW: `cpu_threads`, else `default_optimizer_threads`."""
    return config.cpu_threads or default_optimizer_threads(nproc)


def default_optimizer_threads(nproc: int = 1) -> int:
    """This host's cores under the one rule (`slide_ir.specs.hardware_parts.default_optimizer_threads`).
    In CPU mode the executor leaves the caller's torch setting alone: the compute shares the
    cores there."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return threads_rule(cores or 1, nproc)
