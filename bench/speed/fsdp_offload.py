"""Baseline for the throughput benchmark: PyTorch FSDP2 with CPUOffloadPolicy on one GPU.

The same workload as our executor's points in bench/speed/train_throughput.py (random-init HF model of a
catalog shape, BF16 compute, FP32 master weights and AdamW on the CPU, gradient checkpointing, our
fused linear cross-entropy on the final hidden states), run the way PyTorch offers it: a world of
one process, `fully_shard` per decoder layer and on the root, parameters and gradients offloaded to
(pinned) CPU memory, AdamW stepping on the CPU-resident sharded FP32 parameters.

Invariants: the model is built on the CPU in FP32 and never materialised whole on the GPU (FSDP
copies each layer's BF16 parameters in for its forward/recompute/backward); step 1 is warm-up and
steps 2..N are timed; an out-of-memory (GPU or host) becomes a {"skipped": reason} row.

    python -m bench.speed.fsdp_offload --model llama-3.2-3b --batch 4,8,16 --out results.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import slide_kernels
from bench.speed.train_throughput import RssPeak, random_batches
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model
from slide_kernels import reference

log = logging.getLogger("bench")

SYSTEM = "fsdp2-cpu-offload"


class LossModel(nn.Module):
    """The HF model's decoder plus our LCE as one forward, so that the root `fully_shard` gathers
    the root group's parameters (embedding, final norm, lm_head) around the loss as well."""

    def __init__(self, hf: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.hf, self.hidden_size = hf, hidden_size

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.hf.model(input_ids=ids).last_hidden_state  # (B, S, H)
        weight = self.hf.lm_head.weight  # (V, H), unsharded BF16 inside the root's forward
        # Triton on CUDA (as the executor); the torch reference on CPU, as executor/fused.py does
        lce = (
            slide_kernels.fused_linear_cross_entropy
            if hidden.is_cuda
            else reference.linear_cross_entropy
        )
        return lce(hidden.reshape(-1, self.hidden_size), weight, labels.reshape(-1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mesh(device: str) -> DeviceMesh:
    """A one-rank device mesh, initialising the default process group on first use."""
    device_type = torch.device(device).type
    if not dist.is_initialized():
        # a world of one: any free port will do (a stale one from an earlier group may not)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(_free_port())
        if device_type == "cuda":
            torch.cuda.set_device(torch.device(device).index or 0)
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=0, world_size=1)
    return init_device_mesh(device_type, (1,))


def build(spec: ModelSpec, device: str) -> LossModel:
    """Random-init HF model in FP32 on the CPU, sharded per decoder layer and at the root."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**spec.to_hf_config())
    config._attn_implementation = "sdpa"
    config.use_cache = False  # no KV cache in training (and none under checkpointing)
    with torch.device("cpu"):
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    hf.train()
    model = LossModel(hf, spec.hidden_size)
    shard = {
        "mesh": _mesh(device),
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.device(device).type == "cuda"),
    }
    for layer in hf.model.layers:
        fully_shard(layer, **shard)
    fully_shard(model, **shard)
    return model


def adamw(model: nn.Module) -> tuple[torch.optim.Optimizer, str]:
    """AdamW on the CPU-resident FP32 shards: fused (the CPU kernel) where this torch has it."""
    params = list(model.parameters())
    try:
        return torch.optim.AdamW(params, lr=1e-5, fused=True), "AdamW(fused=True)"
    except RuntimeError as exc:
        log.info("fsdp_offload: fused AdamW unavailable (%s); using foreach", exc)
        return torch.optim.AdamW(params, lr=1e-5, foreach=True), "AdamW(foreach=True)"


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def fsdp2_offload_point(
    spec: ModelSpec, batch: int, seq: int, steps: int = 4, device: str = "cuda"
) -> dict:
    """`steps` optimizer steps of FSDP2 + CPUOffloadPolicy; steps 2..N timed."""
    if steps < 2:
        raise ValueError(f"fsdp2_offload_point: steps must be >= 2 (1 warm-up), got {steps}")
    row = {"system": SYSTEM, "model": spec.name, "batch": batch, "seq": seq}
    on_cuda = torch.device(device).type == "cuda"
    model = optimizer = None
    try:
        if on_cuda:
            torch.cuda.empty_cache()
        with RssPeak() as rss:
            model = build(spec, device)
            optimizer, optim_name = adamw(model)
            if on_cuda:  # the training peak, not sharding's transient (one group's FP32 on GPU)
                torch.cuda.reset_peak_memory_stats(device)
            losses, seconds = _run(model, optimizer, spec, batch, seq, steps, device)
        return row | {
            "optimizer": optim_name,
            "tokens_per_s": batch * seq / seconds,
            "step_time_s": seconds,
            "losses": losses,
            "gpu_peak_allocated": torch.cuda.max_memory_allocated(device) if on_cuda else 0,
            "gpu_peak_reserved": torch.cuda.max_memory_reserved(device) if on_cuda else 0,
            "cpu_peak_rss": rss.peak,
        }
    except torch.OutOfMemoryError:
        return row | {"skipped": "out of GPU memory"}
    except MemoryError:
        return row | {"skipped": "out of host memory"}
    finally:
        model = optimizer = None
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()


def _run(model, optimizer, spec, batch, seq, steps, device) -> tuple[list[float], float]:
    """Returns every step's loss and the mean time of steps 2..N."""
    losses, t0 = [], 0.0
    for step, (ids, labels) in enumerate(random_batches(spec, batch, seq, steps)):
        if step == 1:
            _sync(device)
            t0 = time.perf_counter()
        loss = model(ids.to(device), labels.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    _sync(device)
    seconds = (time.perf_counter() - t0) / (steps - 1)
    if not all(math.isfinite(x) for x in losses):
        log.warning("fsdp_offload: non-finite loss in %s", losses)
    return losses, seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="catalog name, e.g. llama-3.2-3b")
    ap.add_argument("--batch", default="4,8,16")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True, help="JSONL file, appended")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    spec = load_model(args.model)
    try:
        with args.out.open("a") as out:
            for batch in (int(b) for b in args.batch.split(",")):
                row = fsdp2_offload_point(spec, batch, args.seq, args.steps, args.device)
                line = json.dumps(row)
                print(line, flush=True)
                out.write(line + "\n")
                out.flush()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
