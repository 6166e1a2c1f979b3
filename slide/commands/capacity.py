"""`slide capacity`: the largest model a machine can fine-tune, per placement of the optimizer
state and activations (CPU RAM or NVMe). Fitting is decided by the memory ledger alone."""

from __future__ import annotations

import argparse
from typing import Any

from slide import json_out
from slide.commands.common import DEFAULT_MACHINE, add_machine_overrides, drive_count
from slide_ir.planning.capacity import capacity, placements
from slide_ir.specs.config import ACTIVATION_PLACES, OPTIMIZER_PLACES, TrainConfig
from slide_ir.specs.hardware import load_machine

NAME = "capacity"
HELP = "largest model (catalog, and along each family's depth scaling) that fits a machine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--machine",
        default=DEFAULT_MACHINE,
        help=f"catalog name or .toml profile [{DEFAULT_MACHINE}]",
    )
    add_machine_overrides(parser)
    parser.add_argument("--batch", type=int, default=1, help="micro-batch size [1]")
    parser.add_argument("--seq", type=int, default=1024, help="sequence length [1024]")
    parser.add_argument(
        "--activations",
        choices=ACTIVATION_PLACES,
        help="only this activation placement [every useful one]",
    )
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZER_PLACES,
        help="only this optimizer placement [every useful one]",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    machine = load_machine(args.machine, ram_gb=args.ram_gb, nvme=drive_count(args))
    wanted = [
        (a, o)
        for a, o in placements(machine)
        if (args.activations in (None, a)) and (args.optimizer in (None, o))
    ]
    if not wanted:
        wanted = [(args.activations or "cpu", args.optimizer or "cpu")]
    results = [
        capacity(machine, TrainConfig(batch=args.batch, seq=args.seq, activations=a, optimizer=o))
        for a, o in wanted
    ]
    out = {"machine": machine.name, "ram_bytes": machine.ram_bytes, "batch": args.batch,
           "seq": args.seq, "placements": results}  # fmt: skip
    if args.json:
        print(json_out.dumps(out, indent=2))
    else:
        print(render(out))
    return 0


# SlideFormer's host rule: FP32 master + Adam moments in RAM, 12 bytes per parameter
SLIDEFORMER_HOST_BYTES_PER_PARAM = 12


def slideformer_bytes_per_param(optimizer: str, moments: str = "fp32") -> int:
    """SlideFormer's rule for an optimizer placement: the FP32 master and Adam moments left in
    host RAM (it casts each layer's BF16 weights on the fly and keeps no copy of them)."""
    moment_bytes = 8 if moments == "fp32" else 4
    return {"cpu": 4 + moment_bytes, "nvme-moments": 4, "nvme": 0}[optimizer]


def render(out: dict[str, Any]) -> str:
    ram = out["ram_bytes"]
    rule = ram / SLIDEFORMER_HOST_BYTES_PER_PARAM / 1e9
    lines = [f"{out['machine']}: batch {out['batch']} x seq {out['seq']}; {ram / 2**30:.0f} GiB "
             f"of RAM: SlideFormer's rule ({SLIDEFORMER_HOST_BYTES_PER_PARAM} B/param in host "
             f"RAM) gives {rule:.1f} B params"]  # fmt: skip
    for r in out["placements"]:
        best = r["largest_model"] or "none"
        per_param = r["host_bytes_per_param"]
        rule = slideformer_bytes_per_param(r["optimizer"])
        host = f"; host RAM {per_param:.1f} B/param" if per_param is not None else ""
        host += f" (SlideFormer's rule: {rule} B/param)"
        lines.append(
            f"\nactivations on {r['activations']}, optimizer on {r['optimizer']}: "
            f"largest catalog model {best} ({r['largest_model_params'] / 1e9:.1f} B){host}"
        )
        for name, f in r["families"].items():
            member = f["largest_member"] or "none"
            lines.append(
                f"  {name:14s} largest member {member:16s} depth-scaled "
                f"{f['scaled_from']} to {f['scaled_layers']} layers: "
                f"{f['scaled_params'] / 1e9:.1f} B params"
            )
    return "\n".join(lines)
