"""Host RAM per parameter the ledger plans, per optimizer mode, beside SlideFormer's for the same
model and run as its code allocates it (`slide_ir.planning.slideformer_footprint`).

The ledger is the smallest footprint the planner considers (`placement.smallest_ledger`: what
decides whether a model fits; its copy buffers one deep), at batch 1 x seq 1024 without
clipping as `slide capacity --clip none` sizes it (SlideFormer does not clip). SlideFormer's NVMe
tier takes the moments only: it has no mode with the master off the host, so `nvme` is set
against its moments on NVMe. Printed: B/param of all host RAM for each, and the difference.

    python -m bench.memory.host_bytes [--models ...] [--machines ...]
"""

from __future__ import annotations

import argparse

from slide_ir.planning.placement import smallest_ledger
from slide_ir.planning.slideformer_footprint import slideformer_host_bytes
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model

MODES = [(o, m) for o in ("cpu", "nvme-moments", "nvme") for m in ("fp32", "bf16")]


def row(model_name: str, machine_name: str, optimizer: str, moments: str) -> str:
    model, machine = load_model(model_name), load_machine(machine_name)
    config = TrainConfig(batch=1, seq=1024, activations="cpu", optimizer=optimizer,
                         moments_dtype=moments, clip="none")  # fmt: skip
    ours = smallest_ledger(model, machine, config).peak_bytes("cpu") / model.total_params
    theirs = sum(slideformer_host_bytes(model, config).values()) / model.total_params
    return (f"{model_name:14s} {machine_name:15s} {optimizer:13s} {moments:5s} "
            f"{ours:7.3f} {theirs:11.3f} {ours - theirs:+7.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["llama-3.2-3b", "llama-3.1-8b", "qwen2.5-14b", "qwen2.5-72b"])  # fmt: skip
    parser.add_argument("--machines", nargs="+", default=["paper-pc-4090"])
    args = parser.parse_args()
    print(f"{'model':14s} {'machine':15s} {'optimizer':13s} {'mom':5s} {'Slide':>7s} "
          f"{'SlideFormer':>11s} {'diff':>7s}   (host B/param)")  # fmt: skip
    for model in args.models:
        for machine in args.machines:
            for optimizer, moments in MODES:
                print(row(model, machine, optimizer, moments))


if __name__ == "__main__":
    main()
