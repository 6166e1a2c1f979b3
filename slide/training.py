"""What `slide train` does around the executor: resolve inputs, check data and resume state
before any weight is touched, drive `executor.train.train` in chunks (one per `--save-every`),
report progress, write metrics, checkpoints, the trace and the Gantt chart.

A checkpoint directory holds the HF model (config.json + safetensors), `optimizer.safetensors`
(Adam moments by parameter name) and `slide_state.json` (steps done, model and run settings), so
`--resume` continues exactly where the run stopped.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from executor.adam import AdamWConfig
from executor.checkpoint import (
    CheckpointError,
    SafetensorsWeights,
    initial_weights,
    save_checkpoint,
)
from executor.data import CORPUS, TokenStream, batches, load_token_stream
from executor.tokenizer import build_tiny_tokenizer
from executor.train import TrainResult, train
from slide.errors import UserError
from slide.fileio import write_atomic
from slide_ir.config import TrainConfig
from slide_ir.hardware import Machine, load_machine
from slide_ir.model import ModelSpec, load_model
from slide_ir.planner import Plan, plan_from_json
from slide_ir.trace import to_chrome_trace, trace_metrics

log = logging.getLogger(__name__)
STATE_FILE = "slide_state.json"
OPTIM_FILE = "optimizer.safetensors"
TINY_TOKENIZER = Path.home() / ".cache" / "slide" / "tiny-tokenizer"


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    model: str
    machine: str
    config: TrainConfig
    ram_gb: float | None = None
    nvme: int | None = None
    data: str | None = None
    tokenizer: str | None = None
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
    save_every: int = 0
    resume: str | None = None
    metrics: str | None = None
    plan_file: str | None = None  # a saved plan: its model, machine and config win
    trace: str | None = None
    gantt: str | None = None
    save_trace: str | None = None  # the measured Trace in Slide's format (for compare-trace)
    progress: bool = True


def run_training(req: TrainRequest) -> dict[str, Any]:
    device = torch.device(req.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible here (use --device cpu)")
    saved = _saved_plan(req.plan_file)
    spec = saved.model if saved else load_model(req.model)
    machine = saved.machine if saved else resolve_machine(req, device)
    config = saved.config if saved else req.config
    req = replace(req, config=config)
    start, weights, moments = _resume_state(req, spec)
    stream = _token_stream(req, spec)
    data = batches(
        stream,
        batch=config.batch,
        seq=config.seq,
        count=config.steps * config.grad_accum,
        shuffle=req.shuffle,
        seed=req.seed,
        vocab_size=spec.vocab_size,
        source=req.data or str(CORPUS),
    )
    data = _skip(_checked_first(data), start * config.grad_accum)
    if weights is None:
        weights = initial_weights(spec, req.model if Path(req.model).is_dir() else None, req.seed)
    optim = AdamWConfig(
        lr=req.lr,
        schedule=req.lr_schedule,
        warmup_steps=req.warmup_steps,
        weight_decay=req.weight_decay,
        betas=req.betas,
        eps=req.eps,
        total_steps=config.steps,
    )
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, None: None}[req.dtype]
    reporter = _Reporter(req, total=config.steps, start=start)
    result, losses = None, []
    try:
        while start < config.steps:
            chunk = (
                config.steps - start
                if not req.save_every
                else min(req.save_every, config.steps - start)
            )
            chunk_config = replace(config, steps=chunk)
            the_plan = saved if saved and chunk_config == saved.config else None
            result = train(
                spec,
                machine,
                chunk_config,
                initial_state=weights,
                the_plan=the_plan,
                batches=data,
                optim=optim,
                device=device,
                dtype=dtype,
                on_step=reporter.on_step,
                initial_optim_state=moments,
                start_step=start,
            )
            start += result.steps_done
            losses += result.losses
            weights, moments = result.final_state, result.optim_state
            if req.out and (result.interrupted or start < config.steps):
                _save(req, spec, weights, moments, start)
                # continue from the files: the finished run's buffers are freed before the next
                # one allocates its own (two copies of 12 B/param would not fit a large model)
                _, weights, moments = _resume_state(replace(req, resume=req.out), spec, lazy=True)
                result = replace(result, final_state={}, optim_state={})
            if result.interrupted:
                break
    finally:
        reporter.close()
    assert result is not None  # the loop ran: start < steps was checked by the resume logic
    if req.out:
        _save(req, spec, weights, moments, start)
    return _finish(req, result, losses, start, machine)


def _saved_plan(path: str | None) -> Plan | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise UserError(f"plan file {path} does not exist")
    return plan_from_json(Path(path).read_text())


def resolve_machine(req: TrainRequest, device: torch.device) -> Machine:
    """`auto`: this host. The cost figures come from the closest preset; capacities are real."""
    if req.machine != "auto":
        return load_machine(req.machine, ram_gb=req.ram_gb, nvme=req.nvme)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        base = load_machine("h200-16c-128g" if "H200" in name else "paper-pc-4090")
        gpu_bytes = torch.cuda.get_device_properties(device).total_memory
    else:  # CPU mode: the "GPU" tier is host memory too
        name, base, gpu_bytes = "cpu", load_machine("paper-pc-4090"), ram
    machine = replace(
        base, name=f"auto ({name})", gpu=replace(base.gpu, memory_bytes=gpu_bytes), ram_bytes=ram
    )
    if req.ram_gb is not None or req.nvme is not None:
        log.warning("--ram-gb/--nvme apply to named machines; 'auto' measures this host")
    return machine


def _token_stream(req: TrainRequest, spec: ModelSpec) -> TokenStream:
    if req.data:
        return load_token_stream(req.data, tokenizer_dir=req.tokenizer)
    tokenizer = req.tokenizer or build_tiny_tokenizer(TINY_TOKENIZER)
    return load_token_stream(CORPUS, tokenizer_dir=tokenizer)


def _checked_first(
    it: Iterator[tuple[torch.Tensor, torch.Tensor]],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Pull the first batch now, so bad data fails before the model is built."""
    first = next(it)
    return itertools.chain([first], it)


def _skip(it: Iterator[Any], n: int) -> Iterator[Any]:
    return itertools.islice(it, n, None)


# -- checkpoints ---------------------------------------------------------------------------------
def _save(
    req: TrainRequest,
    spec: ModelSpec,
    weights: Mapping[str, torch.Tensor],
    moments: Mapping[str, torch.Tensor],
    steps_done: int,
) -> None:
    assert req.out is not None
    state = {
        "steps_done": steps_done,
        "model": spec.to_hf_config(),
        "config": asdict(req.config),
        "seed": req.seed,
        "data": req.data,
    }
    # FP32: the master weights themselves, so --resume continues exactly (transformers loads it
    # like any checkpoint; pass dtype=torch.bfloat16 to from_pretrained for a BF16 copy)
    out = save_checkpoint(
        req.out,
        spec,
        weights,
        dtype=torch.float32,
        extra_files={STATE_FILE: json.dumps(state, indent=2)},
    )
    tmp = out / f".{OPTIM_FILE}.tmp"
    save_file({k: v.contiguous() for k, v in moments.items()}, str(tmp))
    tmp.replace(out / OPTIM_FILE)
    log.info("checkpoint (%d steps) written to %s", steps_done, out)


def _resume_state(
    req: TrainRequest, spec: ModelSpec, *, lazy: bool = False
) -> tuple[int, Any, Any]:
    if not req.resume:
        return 0, None, None
    ckpt = Path(req.resume)
    state_file = ckpt / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(
            f"{state_file} is missing: --resume needs a directory written by slide train"
        )
    try:
        state = json.loads(state_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{state_file} is corrupt: {exc}") from None
    if state["model"] != spec.to_hf_config():
        diff = sorted(
            k
            for k in set(state["model"]) | set(spec.to_hf_config())
            if state["model"].get(k) != spec.to_hf_config().get(k)
        )
        raise UserError(f"--resume {ckpt}: the checkpoint's model differs from --model in {diff}")
    mine = asdict(req.config)
    diff = sorted(k for k in ("batch", "seq", "grad_accum") if state["config"].get(k) != mine[k])
    if diff:
        was = ", ".join(f"{k}={state['config'][k]}" for k in diff)
        raise UserError(
            f"--resume {ckpt}: the checkpoint was trained with different {diff} ({was})"
        )
    optim_file = ckpt / OPTIM_FILE
    if not optim_file.is_file():
        raise CheckpointError(f"{optim_file} is missing")
    weights = SafetensorsWeights(ckpt)
    if lazy:
        return int(state["steps_done"]), weights, SafetensorsWeights.single(optim_file)
    return int(state["steps_done"]), {k: weights[k] for k in weights}, load_file(str(optim_file))


# -- reporting -----------------------------------------------------------------------------------
class _Reporter:
    """Progress bar and metrics JSONL, one line per optimizer step."""

    def __init__(self, req: TrainRequest, *, total: int, start: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total, initial=start, unit="step", disable=not req.progress, desc="train"
        )
        mode = "a" if req.resume else "w"  # a resumed run continues its metrics file
        self.metrics = open(req.metrics, mode, encoding="utf-8") if req.metrics else None  # noqa: SIM115

    def on_step(self, step: int, loss: float, lr: float, metrics: dict[str, Any]) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{metrics.get('tokens_per_s', 0):,.0f}")
        if self.metrics:
            self.metrics.write(json.dumps({"step": step, "loss": loss, "lr": lr, **metrics}) + "\n")
            self.metrics.flush()

    def close(self) -> None:
        self.bar.close()
        if self.metrics:
            self.metrics.close()


def _finish(
    req: TrainRequest, result: TrainResult, losses: list[float], steps_done: int, machine: Machine
) -> dict[str, Any]:
    """Trace files of the last chunk; losses of the whole run (this invocation)."""
    if req.trace:
        write_atomic(req.trace, json.dumps(to_chrome_trace(result.trace)))
    if req.save_trace:
        write_atomic(req.save_trace, result.trace.to_json())
    if req.gantt:
        from slide.gantt import plot_gantt

        plot_gantt(result.trace, req.gantt, zoom="auto")
    m = trace_metrics(result.trace)
    return {
        "steps_done": steps_done,
        "interrupted": result.interrupted,
        "final_loss": losses[-1] if losses else None,
        "losses": losses,
        "machine": machine.name,
        "tokens_per_s": m.tokens_per_s,
        "eta": m.eta,
        "checkpoint": req.out,
    }


def demo_finetune(out: Path) -> str:
    """The README demo's real run: tiny-llama, a few dozen steps on the bundled corpus."""
    out.mkdir(parents=True, exist_ok=True)
    req = TrainRequest(
        model="tiny-llama",
        machine="auto",
        config=TrainConfig(batch=8, seq=128, steps=40),
        lr=3e-3,
        out=str(out / "checkpoint"),
        metrics=str(out / "metrics.jsonl"),
        trace=str(out / "trace.json"),
        gantt=str(out / "gantt.png"),
    )
    summary = run_training(req)
    return (
        f"fine-tuned tiny-llama for {summary['steps_done']} steps: loss {summary['losses'][0]:.3f}"
        f" -> {summary['final_loss']:.3f}; measured Gantt {out / 'gantt.png'}, checkpoint {req.out}"
    )
