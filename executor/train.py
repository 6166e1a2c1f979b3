"""`train()`: plan, check, allocate, load, run the Graph's lanes over the batches, hand back.

One call runs `config.steps` optimizer steps (each `config.grad_accum` micro-batches of
(batch, seq) tokens) and returns the FP32 weights and Adam moments by Hugging Face name, the
per-step losses and the measured Trace. Periodic checkpoints and resume are consecutive calls:
pass the previous result's weights and moments back with `start_step` = steps already done.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from executor import setup as setup_mod
from executor.adam import AdamWConfig
from executor.env import MicroBatch
from executor.runtime import Shared, make_shared, start_lanes, stop_lanes, wait_ops
from slide_ir.config import TrainConfig
from slide_ir.hardware import Machine
from slide_ir.model import ModelSpec
from slide_ir.planner import Plan, plan
from slide_ir.trace import MemorySample, Trace

log = logging.getLogger("executor.train")

OnStep = Callable[[int, float, float, dict[str, Any]], bool | None]
# on_save(step, read_state): called on the main thread at a step boundary with the lanes idle on
# the model's state; read_state() gives (weights, moments) by HF name, mostly views of the live
# host buffers, valid until on_save returns
ReadState = Callable[[], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]
OnSave = Callable[[int, ReadState], None]


class InfeasiblePlanError(RuntimeError):
    """The plan does not fit the machine (or the real device); the message names the tier."""


class NonFiniteLossError(FloatingPointError):
    pass


class DataError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    final_state: dict[str, torch.Tensor]  # HF names, FP32, CPU
    optim_state: dict[str, torch.Tensor]  # `<name>.exp_avg`, `<name>.exp_avg_sq`, FP32, CPU
    losses: list[float]  # mean token loss of each step done
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
    """
    p = the_plan or plan(model_spec, machine, config)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    check_feasible(p, dev)
    optim = optim or AdamWConfig()
    total = optim.total_steps or (start_step + config.steps)
    with tempfile.TemporaryDirectory(prefix="slide-nvme-") as tmp:
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
        )
        try:
            saver = _Saver(save_every, on_save, run) if on_save and save_every else None
            return _drive(p, run, iter(batches), on_step, start_step, saver)
        except torch.OutOfMemoryError as exc:
            exc.add_note(_ledger_note(p))
            raise
        finally:
            run.close()


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


def _micro_batches(
    it: Iterator[tuple[torch.Tensor, torch.Tensor]], step: int, p: Plan, pin: bool
) -> list[MicroBatch]:
    """The step's micro-batches, checked, each scaled by 1 / (labelled tokens of the step)."""
    shape = (p.config.batch, p.config.seq)
    raw = []
    for micro in range(p.config.grad_accum):
        try:
            ids, labels = next(it)
        except StopIteration:
            raise DataError(
                f"the data ran out at step {step}, micro-batch {micro}: the run needs "
                f"{p.config.steps * p.config.grad_accum} micro-batches of {shape}"
            ) from None
        for what, t in (("input_ids", ids), ("labels", labels)):
            if tuple(t.shape) != shape or t.dtype != torch.int64:
                raise DataError(
                    f"step {step}: {what} must be int64 {shape}, got {t.dtype} {tuple(t.shape)}"
                )
        raw.append((ids, labels))
    valid = sum(int((labels != -100).sum()) for _, labels in raw)
    if valid == 0:
        raise DataError(f"step {step}: no labelled token (all labels are -100)")
    return [
        MicroBatch(
            step=step,
            micro=m,
            ids=ids.pin_memory() if pin else ids,
            labels=labels.pin_memory() if pin else labels,
            scale=1.0 / valid,
        )
        for m, (ids, labels) in enumerate(raw)
    ]


def _drive(
    p: Plan,
    run: setup_mod.Run,
    it: Iterator[tuple[torch.Tensor, torch.Tensor]],
    on_step: OnStep | None,
    start_step: int,
    saver: _Saver | None,
) -> TrainResult:
    """Start the lanes, run the main loop, stop the lanes (re-raising a lane's error), collect."""
    env = run.env
    shared = make_shared(env, p.graph, optimizer_threads(p.config) if env.cuda else None)
    loop = _MainLoop(p, run, shared, it, on_step, start_step, saver)
    workers = []
    try:
        loop.feed()
        workers = start_lanes(shared)
        loop.run()
    except BaseException:
        stop_lanes(shared, workers, abort=True)  # a lane's error, if any, wins
        raise
    stop_lanes(shared, workers, abort=len(loop.losses) < p.config.steps)
    if env.cuda:
        torch.cuda.synchronize(env.device)
    weights, moments = run.extract()
    loop.sample_memory()  # the host copy of GPU-kept state is part of the run's peak
    done = len(loop.losses)
    trace = Trace(
        spans=shared.recorder.spans(done),
        memory=tuple(loop.samples),
        info=p.graph.info,
        meta=run.meta(shared.knobs),
    )
    return TrainResult(
        final_state=weights,
        optim_state=moments,
        losses=loop.losses,
        lrs=loop.lrs,
        steps_done=done,
        interrupted=loop.interrupted,
        trace=trace,
        meta=dict(trace.meta),
    )


@dataclass(frozen=True, slots=True)
class _Saver:
    every: int
    on_save: OnSave
    run: setup_mod.Run

    def due(self, global_step: int) -> bool:
        return global_step % self.every == 0

    def save(self, global_step: int) -> None:
        if self.run.env.cuda:
            torch.cuda.synchronize(self.run.env.device)
        self.on_save(global_step, self.run.extract)


class _MainLoop:
    """The main thread's part: feed step s+1, wait for step s, report it. Feeding one step
    ahead keeps the lanes busy across the step boundary; stopping (on_step returned True,
    Ctrl-C) stops feeding, so the state after the last fed step is consistent. Before a save
    the next step is not fed: with no micro-batch the lanes cannot reach its backward, so no
    update touches the state while it is read (uploads and prefetches of the next step only
    read it)."""

    def __init__(
        self,
        p: Plan,
        run: setup_mod.Run,
        shared: Shared,
        it: Iterator[tuple[torch.Tensor, torch.Tensor]],
        on_step: OnStep | None,
        start_step: int,
        saver: _Saver | None,
    ) -> None:
        self.p, self.run_, self.shared, self.it = p, run, shared, it
        self.on_step, self.start_step, self.saver = on_step, start_step, saver
        self.by_step: dict[int, list[str]] = {}
        for op in p.graph.ops:
            self.by_step.setdefault(op.step, []).append(op.id)
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.samples = list(run.memory_at_start(shared.recorder.t0))
        self.fed, self.stop, self.interrupted = 0, False, False
        self.last = shared.recorder.t0

    def feed(self) -> None:
        self.fed += 1
        env = self.run_.env
        for mb in _micro_batches(self.it, self.fed, self.p, pin=env.cuda):
            env.batches.put(mb)

    def run(self) -> None:
        last = self.p.config.steps
        for step in range(1, last + 1):
            while not self.stop and self.fed < min(step + 1, last) and not self.saving(step):
                self.feed()
            try:
                wait_ops(self.shared, self.by_step[step])
            except KeyboardInterrupt:
                log.warning("interrupted: finishing the %d step(s) started", self.fed - step + 1)
                self.stop = self.interrupted = True
                wait_ops(self.shared, self.by_step[step])
            self.report(step)
            if self.stop and step == self.fed:
                return
            if self.saving(step):
                assert self.saver is not None
                self.saver.save(self.start_step + step)
                self.feed()

    def saving(self, step: int) -> bool:
        """Whether the state after `step` is saved before step + 1 is fed."""
        return (
            self.saver is not None
            and step == self.fed
            and step < self.p.config.steps
            and self.saver.due(self.start_step + step)
        )

    def sample_memory(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        self.samples.extend(self.run_.memory_sample(now - self.shared.recorder.t0))

    def report(self, step: int) -> None:
        env, now = self.run_.env, time.perf_counter()
        loss = float(env.loss_host[step - 1])
        lr = env.optim.lr_at(self.start_step + step, env.total_steps)
        self.losses.append(loss)
        self.lrs.append(lr)
        self.sample_memory(now)
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"step {self.start_step + step}: loss is {loss}; stopping (this step's update "
                "has already been applied: keep the previous checkpoint)"
            )
        metrics = _step_metrics(self.p, now - self.last)
        self.last = now
        if self.on_step is not None and self.on_step(self.start_step + step, loss, lr, metrics):
            self.stop = True


def optimizer_threads(config: TrainConfig) -> int:
    """Intra-op threads for the CPU AdamW: `cpu_threads`, else `default_optimizer_threads`."""
    return config.cpu_threads or default_optimizer_threads()


def default_optimizer_threads() -> int:
    """Every core but four: the gpu lane's thread issuing kernels, autograd's device thread,
    the copy lanes and the main thread need theirs. On the H200 host (16 vCPUs) 12 optimizer
    threads ran a 3B step 7% faster than 14 (bench/RESULTS.md). In CPU mode the caller's torch
    setting is left alone: there the compute shares the cores too."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) - 4)


def _step_metrics(p: Plan, seconds: float) -> dict[str, Any]:
    tokens = p.graph.info.tokens_per_step
    return {
        "step_time_s": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else float("inf"),
        "model_tflops": p.graph.info.flops_per_step / seconds / 1e12 if seconds > 0 else 0.0,
    }


__all__ = [
    "AdamWConfig",
    "DataError",
    "InfeasiblePlanError",
    "MemorySample",
    "NonFiniteLossError",
    "TrainResult",
    "train",
]
