"""Host RAM per parameter the ledger plans, per optimizer mode, beside SlideFormer's rule.

SlideFormer keeps only the optimizer state in host RAM (FP32 master + Adam moments: 12 B/param
with FP32 moments) and casts each layer's BF16 weights on the fly; its rule per mode is the
state left in RAM (`slideformer_bytes_per_param`). The ledger is the smallest footprint the planner considers
(`placement.smallest_ledger`: what decides whether a model fits), at batch 1 x seq 1024 as
`slide capacity` sizes it. Printed: all host RAM per parameter, and the parameter-proportional
part (less the fixed process runtime and the saved layer inputs).

    python -m bench.memory.host_bytes [--models ...] [--machines ...]
"""

from __future__ import annotations

import argparse

from slide.commands.capacity import slideformer_bytes_per_param
from slide_ir.planning.placement import smallest_ledger
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model

MODES = [(o, m) for o in ("cpu", "nvme-moments", "nvme") for m in ("fp32", "bf16")]
NOT_PER_PARAM = ("saved layer inputs (pinned)", "process runtime (python, torch)")


def row(model_name: str, machine_name: str, optimizer: str, moments: str) -> str:
    model, machine = load_model(model_name), load_machine(machine_name)
    config = TrainConfig(batch=1, seq=1024, activations="cpu", optimizer=optimizer,
                         moments_dtype=moments)  # fmt: skip
    led = smallest_ledger(model, machine, config)
    host = led.peak_bytes("cpu")
    fixed = sum(b for label, b in led.breakdown("cpu").items() if label in NOT_PER_PARAM)
    p = model.total_params
    return (f"{model_name:14s} {machine_name:15s} {optimizer:13s} {moments:5s} "
            f"{host / p:7.2f} {(host - fixed) / p:9.2f} {slideformer_bytes_per_param(optimizer, moments):6d}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "qwen2.5-72b"])
    parser.add_argument("--machines", nargs="+", default=["h200-16c-128g", "paper-pc-4090"])
    args = parser.parse_args()
    print(f"{'model':14s} {'machine':15s} {'optimizer':13s} {'mom':5s} {'B/param':>7s} "
          f"{'per-param':>9s} {'rule':>6s}")  # fmt: skip
    for model in args.models:
        for machine in args.machines:
            for optimizer, moments in MODES:
                print(row(model, machine, optimizer, moments))


if __name__ == "__main__":
    main()
