"""`train()`: plan, check, allocate, load, run the Graph's lanes over the batches, hand back.

One call runs `config.steps` optimizer steps (each `config.grad_accum` micro-batches of
(batch, seq) tokens), repeating a graph of a few steps (`executor.loop`), and returns the FP32
weights and Adam moments by Hugging Face name, the latest losses and the measured Trace of the
trace window. Periodic checkpoints are taken at step boundaries through `on_save`; resume is a
second call: pass the saved weights and moments back with `start_step` = steps already done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from executor import host_adam, leftovers
from executor import knobs as knobs_mod
from executor import setup as setup_mod
from executor.adam import AdamWConfig
from executor.loop import (
    REPLAN_AFTER,
    DataError,
    Driver,
    NonFiniteLossError,
    OnSave,
    OnStep,
    Saver,
    graph_config,
    graph_plan,
    rank_plan,
)
from executor.phases import Phases
from executor.ranks import Ranks
from executor.recording import StepWindow, default_trace_steps
from executor.state import ReadState, read_on_main
from slide_ir.ir.trace import MemorySample, Trace
from slide_ir.planning import refit
from slide_ir.planning.data_parallel import check_nproc, shard_plan
from slide_ir.planning.planner import Plan, plan
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.hardware_parts import default_optimizer_threads as threads_rule
from slide_ir.specs.model import ModelSpec

log = logging.getLogger("executor.train")


class InfeasiblePlanError(RuntimeError):
    """The plan does not fit the machine (or the real device); the message names the tier."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    final_state: dict[str, torch.Tensor]  # HF names, FP32, CPU (empty: `hand_back=False`)
    optim_state: dict[str, torch.Tensor]  # `<name>.exp_avg`, `<name>.exp_avg_sq`, FP32, CPU
    losses: list[float]  # mean token loss of each step done (the last `LOSS_HISTORY`)
    lrs: list[float]
    steps_done: int  # < config.steps when stopped early (on_step returned True, Ctrl-C)
    interrupted: bool
    trace: Trace
    meta: dict[str, Any] = field(default_factory=dict)


def train(
    model_spec: ModelSpec,
    machine: Machine,
    config: TrainConfig,
    *,
    initial_state: Mapping[str, torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    optim: AdamWConfig | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    on_step: OnStep | None = None,
    initial_optim_state: Mapping[str, torch.Tensor] | None = None,
    start_step: int = 0,
    nvme_dir: str | Path | Iterable[str | Path] | None = None,
    the_plan: Plan | None = None,
    save_every: int = 0,
    on_save: OnSave | None = None,
    trace_steps: tuple[int, int] | None = None,
    log_every: int = 10,
    phases: Phases | None = None,
    on_finish: OnSave | None = None,
    hand_back: bool = True,
    replan_request: TrainConfig | None = None,
    ranks: Ranks | None = None,
) -> TrainResult:
    """Fine-tune all parameters for `config.steps` optimizer steps. See the module docstring.

    batches: (input_ids, labels) LongTensors (batch, seq), labels already shifted (label t is
    the token after input t), -100 ignored; `grad_accum` of them per step. on_step(step, loss,
    lr, metrics) is called on the main thread after each step; returning True stops the run
    after the steps already handed to the lanes (at most one more). Clipping: per unit, as the
    plan's TrainConfig says (`clip`, `clip_norm`). on_save is called after every step whose
    global number (start_step + step) is a multiple of `save_every`, except the last: the next
    step is fed only once it returns, so the state it reads is that step's, and the engine
    stays up (the caller saves the final state from the result).

    The run repeats a graph of at most `GRAPH_STEPS` steps (`the_plan`, if given, is that
    graph's plan: its steps may be fewer than `config.steps`). The trace keeps the spans and
    memory samples of steps `trace_steps` (A, B: 1-based, inclusive, counted in this call;
    None: `recording.default_trace_steps`, after the re-plan check when there is one);
    every `log_every` steps on_step's metrics add tokens/s and lane busy shares over them.
    `phases` times set-up and hand-back (`executor.phases`); the lanes start at its "lanes" mark.

    on_finish(global step, read_state) is called once after the last step, the engine still up
    (the caller's final save). `hand_back=False` leaves the result's state empty: gathering a
    model's whole FP32 state into RAM costs seconds and, for state homed on NVMe, the very RAM
    the NVMe tier saves, so a caller that only saves streams it through `on_finish` instead.

    replan_request: the configuration `the_plan` was planned from, its "auto" choices unresolved:
    after the first steady steps the run re-fits the machine profile to its measured lanes and,
    where the placement search then chooses a placement predicted >= 3% faster, moves the state
    into an engine built for it and goes on (`slide_ir.planning.refit`; `meta["replan"]` says what was
    decided and why). The move holds the old and the new engine's host memory at once, so it is
    made only when the machine's RAM holds both, and only when the steps left are predicted to
    save more than the move costs (`MOVE_COST_PER_SETUP` times this run's set-up).

    ranks: this process's rank of a data-parallel run (`executor.ranks`). `config.batch` is
    then the global batch: every rank reads the same `batches` (the global micro-batches) and
    takes its rows; `the_plan`, if given, is one rank's single-GPU plan (at batch / N), whose
    graph the run shards; every rank updates its shard of each unit. on_step gets the global
    loss on every rank; on_save and on_finish are called on rank 0 only (pass them on every
    rank: the others serve rank 0's reads meanwhile), and only rank 0's result holds the
    state. A rank's failure is published to the others, which name it (`RankFailure`).
    """
    if log_every < 1:
        raise ValueError(f"log_every must be >= 1, got {log_every}")
    if ranks is not None and replan_request is not None:
        raise ValueError("re-planning is for one process: data-parallel ranks keep their plan")
    checked_after = REPLAN_AFTER if replan_request is not None else None
    window = StepWindow(*(trace_steps or default_trace_steps(config.steps, checked_after)))
    nproc = ranks.nproc if ranks is not None else 1
    if the_plan is None:
        rank_config = config
        if ranks is not None:
            check_nproc(machine, config, ranks.nproc)
            rank_config = replace(config, batch=config.batch // ranks.nproc)
        the_plan = plan(model_spec, machine, graph_config(rank_config), nproc=nproc)
    p = graph_plan(the_plan, config.steps)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if ranks is None:
        check_feasible(p, dev)
    else:  # one rank's plan: its single-GPU ledger need not fit one GPU, its shard must
        _check_ranks_fit(p, ranks, dev)
        p = rank_plan(p, ranks)
    optim = optim or AdamWConfig()
    total = optim.total_steps or (start_step + config.steps)
    phases = phases or Phases()
    host_adam.prebuild()  # overlaps the set-up below (a fresh host compiles it)
    with _telling(ranks), leftovers.scratch_dir() as tmp:
        run = setup_mod.build(
            p,
            device=dev,
            dtype=dtype,
            optim=optim,
            step_offset=start_step,
            total_steps=total,
            nvme_dir=nvme_dir or Path(tmp),  # drive k's file in nvme_dir[k % len]; none: a tmp dir
            initial_state=initial_state,
            initial_optim_state=initial_optim_state,
            phases=phases,
            ranks=ranks,
        )
        replanned: list[refit.Replanned] = []

        def replan(
            ran: Plan, busy: dict[str, float], steps: set[int], by_kind: dict[str, float]
        ) -> tuple[Plan, setup_mod.Run] | None:
            assert replan_request is not None
            check = refit.replan(ran, replan_request, busy, steps, by_kind)
            if check.plan is not None:
                left = config.steps - driver.progress.done
                setup_s = phases.seconds.get("buffers", 0.0) + phases.seconds.get("state", 0.0)
                keep = _reason_to_stay(ran, check, left, MOVE_COST_PER_SETUP * setup_s)
                if keep:
                    check = replace(check, plan=None, reason=f"{check.reason}, but {keep}: kept")
            replanned.append(check)
            if check.plan is None:
                log.info("re-plan: kept the running placement (%s)", check.reason)
                return None
            new_p = graph_plan(check.plan, config.steps)
            check_feasible(new_p, dev)
            done = driver.progress.done
            log.warning("re-plan after step %d: %s", start_step + done, check.reason)
            old = driver.run_
            weights, moments = old.extract()
            old.close()
            moved = setup_mod.build(
                new_p,
                device=dev,
                dtype=dtype,
                optim=optim,
                step_offset=start_step + done,
                total_steps=total,
                nvme_dir=nvme_dir or Path(tmp),
                initial_state=weights,
                initial_optim_state=moments,
                phases=Phases(),
            )
            return new_p, moved

        driver: Driver | None = None
        try:
            driver = Driver(
                p,
                run,
                iter(batches),
                steps=config.steps,
                start_step=start_step,
                on_step=on_step,
                saver=Saver(save_every, on_save) if save_every and (on_save or ranks) else None,
                window=window,
                log_every=log_every,
                cpu_threads=optimizer_threads(p.config, nproc) if run.env.cuda else None,
                replan=replan if replan_request is not None else None,
                steady_from=steady_from(config.steps, checked_after),
            )
            result = _result(driver, phases, on_finish, start_step, hand_back)
            if replanned:
                result.meta["replan"] = replanned[0].summary()
            return result
        except torch.OutOfMemoryError as exc:
            exc.add_note(_ledger_note(p))
            raise
        finally:
            with phases("release"):
                (driver.run_ if driver is not None else run).close()


# A move extracts the state, frees the old engine and builds the new one: on the H200 a 3B move
# (llama-3.2-3b batch 16) took 19.1 s against that run's 8.7 s of buffers and state set-up.
MOVE_COST_PER_SETUP = 2.2


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
        return (f"moving the state needs {need / 1e9:.1f} GB of RAM "
                f"({ran.machine.ram_bytes / 1e9:.1f} GB)")  # fmt: skip
    saved = steps_left * (check.running_s - check.best_s)
    if saved < move_s:
        return (f"the {steps_left} steps left would save {saved:.1f} s, "
                f"the move costs about {move_s:.1f} s")  # fmt: skip
    return ""


def _result(
    driver: Driver,
    phases: Phases,
    on_finish: OnSave | None,
    start_step: int,
    hand_back: bool,
) -> TrainResult:
    phases.mark("lanes")
    pr = driver.run()
    run = driver.run_  # the engine that ran last (re-planning may have moved the state)
    if "first step end" in phases.marks:
        phases.add("steps", phases.since("first step end"))
    if host_adam.ready_s is not None:
        phases.add("host AdamW kernel", host_adam.ready_s, overlapped=True)
    if on_finish is not None:
        read_on_main(run.env, lambda read: on_finish(start_step + pr.done, read))
    weights: dict[str, torch.Tensor] = {}
    moments: dict[str, torch.Tensor] = {}
    if hand_back:
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


@contextlib.contextmanager
def _telling(ranks: Ranks | None) -> Iterator[None]:
    """Data parallel: a peer's failure, when one was published, is what stopped this rank
    (its collectives broke): raise that; else publish this rank's own."""
    try:
        yield
    except BaseException as exc:
        failure = ranks.settle(exc) if ranks is not None else None
        if failure is not None:
            raise failure from exc
        raise


def _check_ranks_fit(p: Plan, ranks: Ranks, dev: torch.device) -> None:
    """Each rank's GPU and the host's RAM and NVMe hold N ranks' shares (in CPU mode the
    host holds every rank's "GPU" part too); the device holds this rank's."""
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
    if dev.type == "cuda":
        _, total = torch.cuda.mem_get_info(dev)
        if dp.rank_bytes("gpu") > total:
            raise InfeasiblePlanError(
                f"rank {ranks.rank} needs {dp.rank_bytes('gpu') / 2**30:.2f} GiB of GPU memory; "
                f"{torch.cuda.get_device_name(dev)} has {total / 2**30:.2f} GiB"
            )


def _ledger_note(p: Plan) -> str:
    parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in p.ledger.breakdown("gpu").items())
    return (
        f"the ledger planned {p.ledger.peak_bytes('gpu') / 2**30:.2f} GiB on the GPU ({parts} GiB)"
    )


def check_feasible(p: Plan, dev: torch.device) -> None:
    """Refuse before allocating anything: the ledger against the machine, then the device."""
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
    if dev.type == "cuda":
        _, total = torch.cuda.mem_get_info(dev)
        need = p.ledger.peak_bytes("gpu")
        if need > total:
            raise InfeasiblePlanError(
                f"plan needs {need / 2**30:.2f} GiB of GPU memory; {torch.cuda.get_device_name(dev)}"
                f" has {total / 2**30:.2f} GiB ({(need - total) / 2**30:.2f} GiB short)"
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
    In CPU mode the caller's torch setting is left alone: there the compute shares the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return threads_rule(cores or 1, nproc)


__all__ = [
    "AdamWConfig",
    "DataError",
    "InfeasiblePlanError",
    "MemorySample",
    "NonFiniteLossError",
    "OnSave",
    "OnStep",
    "ReadState",
    "TrainResult",
    "train",
]
