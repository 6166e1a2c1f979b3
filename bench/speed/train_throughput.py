"""Executor throughput on a CUDA machine, with the same-run references the issue asks for.

For each (model shape, batch, resident): a few optimizer steps of random-init full fine-tuning
(seq 1024, BF16 compute, FP32 master + AdamW on the CPU), measured from the executor's own trace
(steady steps >= 2): tokens/s, model TFLOP/s, eta and its three terms, GPU peak allocated and
reserved, host peak RSS; and, at the same batch, the compute-only ceiling (forward + recompute +
backward of the same model, all resident on the GPU, no optimizer). Optionally PyTorch FSDP2 with
CPUOffloadPolicy on one GPU. Writes one JSON line per point to --out and, with --traces DIR, the
measured Trace of each point (for bench/speed/accuracy.py).

    python -m bench.speed.train_throughput --model llama-3.2-3b --batch 8,16 --variants pure,streamed=auto \
        --out results.jsonl --traces traces/
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import torch

from executor.adam import AdamWConfig
from slide.session import train
from slide.weights import param_names, param_shape
from slide_ir.ir.trace import trace_metrics
from slide_ir.planning.planner import plan, plan_to_json
from slide_ir.specs.config import TrainConfig, parse_count_or_auto
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model
from slide_kernels import fused_linear_cross_entropy

log = logging.getLogger("bench")


class TiledInit(Mapping[str, torch.Tensor]):
    """Random-looking weights made fast: one random block tiled (throughput does not depend on
    the values; a per-tensor RNG pass over 8e9 values would dominate the benchmark's time)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec, self.names = spec, param_names(spec)
        self.block = torch.randn(1 << 20) * 0.02

    def __getitem__(self, name: str) -> torch.Tensor:
        shape = param_shape(self.spec, name)
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        n = torch.Size(shape).numel()
        reps = -(-n // self.block.numel())
        return self.block.repeat(reps)[:n].view(shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def random_batches(spec: ModelSpec, batch: int, seq: int, count: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        ids = torch.randint(0, spec.vocab_size, (batch, seq + 1), generator=gen)
        yield ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


class RssPeak:
    """Samples this process's RSS every 50 ms: the host peak of one benchmark point."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            time.sleep(0.05)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


VARIANT_FIELDS = {
    "resident": lambda v: parse_count_or_auto("resident", v),
    "streamed": lambda v: parse_count_or_auto("streamed", v),
    "cpu_threads": int,
    "grad_buffers": int,
    "moments_dtype": str,
    "activations": str,
}


def variant_fields(variant: str) -> dict[str, object]:
    """`pure` (every unit slides, every update on the CPU: `--placement small`) or
    `key=value+key=value` over VARIANT_FIELDS, e.g. `streamed=auto`, `resident=0+streamed=8`
    (what is not pinned, the placement search chooses)."""
    if variant == "pure":
        return {"placement": "small"}
    out = {}
    for item in variant.split("+"):
        key, _, value = item.partition("=")
        if key not in VARIANT_FIELDS or not value:
            raise SystemExit(
                f"variant item {item!r}: use key=value with key in {list(VARIANT_FIELDS)}"
            )
        out[key] = VARIANT_FIELDS[key](value)
    return out


def slide_point(
    spec: ModelSpec, machine, batch: int, seq: int, steps: int, variant: str, traces: Path | None
) -> dict:
    config = TrainConfig(batch=batch, seq=seq, steps=steps, **variant_fields(variant))
    p = plan(spec, machine, config)
    row = {
        "system": "slide",
        "model": spec.name,
        "batch": batch,
        "variant": variant,
        "resident_units": len(p.ledger.resident),
        "streamed_units": len(p.ledger.streamed),
        "ledger_gpu_bytes": p.ledger.peak_bytes("gpu"),
        "ledger_cpu_bytes": p.ledger.peak_bytes("cpu"),
    }
    if not p.feasible:
        return row | {"skipped": f"does not fit: {p.ledger.overflows()}"}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with RssPeak() as rss:
        result = train(
            spec,
            machine,
            config,
            initial_state=TiledInit(spec),
            batches=random_batches(spec, batch, seq, steps),
            optim=AdamWConfig(lr=1e-5),
            device="cuda",
            dtype=torch.bfloat16,
            planned=p,
        )
    m = trace_metrics(result.trace, p.graph)
    if traces is not None:
        traces.mkdir(parents=True, exist_ok=True)
        name = f"{spec.name}_b{batch}_{re.sub('[^A-Za-z0-9]+', '-', variant)}"
        (traces / f"{name}.trace.json").write_text(result.trace.to_json())
        (traces / f"{name}.plan.json").write_text(plan_to_json(p))
    return row | {
        "wall_s": time.perf_counter() - t0,
        "tokens_per_s": m.tokens_per_s,
        "model_tflops": m.tflops,
        "step_time_s": m.step_time_s,
        "eta": m.eta,
        "t_bwd_s": m.t_bwd_s,
        "t_d2h_s": m.t_d2h_s,
        "t_update_s": m.t_update_s,
        "gpu_util": m.gpu_util,
        "bottleneck": m.bottleneck,
        "losses": result.losses,
        # the executor samples (and resets) the allocator's peak once per step: take the max
        "gpu_peak_allocated": m.peak_bytes.get("gpu", 0),
        "gpu_peak_reserved": torch.cuda.max_memory_reserved(),
        "cpu_peak_rss": rss.peak,
    }


def compute_only_point(spec: ModelSpec, batch: int, seq: int, iters: int = 3) -> dict:
    """HF model in BF16 on the GPU with gradient checkpointing (forward, recompute, backward),
    our fused LCE for the loss, no optimizer: the ceiling a sliding run is measured against."""
    from transformers import AutoConfig, AutoModelForCausalLM

    row = {"system": "compute-only", "model": spec.name, "batch": batch}
    config = AutoConfig.for_model(**spec.to_hf_config())
    config._attn_implementation = "sdpa"
    try:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
        model.gradient_checkpointing_enable()
        model.train()
        ids, labels = next(random_batches(spec, batch, seq, 1))
        ids, labels = ids.cuda(), labels.cuda()

        def step() -> None:
            hidden = model.model(input_ids=ids).last_hidden_state
            loss = fused_linear_cross_entropy(
                hidden.view(-1, spec.hidden_size), model.lm_head.weight, labels.view(-1)
            )
            loss.backward()

        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / iters
        return row | {"tokens_per_s": batch * seq / seconds, "step_time_s": seconds}
    except torch.OutOfMemoryError:
        return row | {"skipped": "out of GPU memory"}
    finally:
        model = None
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--machine", default="h200-16c-128g")
    ap.add_argument("--batch", default="4,8,16,32")
    ap.add_argument(
        "--variants", default="pure", help="comma list of variants (see variant_fields) [pure]"
    )
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--compute-only", action="store_true")
    ap.add_argument("--traces", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    spec, machine = load_model(args.model), load_machine(args.machine)
    with args.out.open("a") as out:
        for batch in (int(b) for b in args.batch.split(",")):
            points = [
                slide_point(spec, machine, batch, args.seq, args.steps, v, args.traces)
                for v in args.variants.split(",")
            ]
            if args.compute_only:
                points.append(compute_only_point(spec, batch, args.seq))
            for row in points:
                line = json.dumps(row)
                print(line, flush=True)
                out.write(line + "\n")
                out.flush()


if __name__ == "__main__":
    main()
