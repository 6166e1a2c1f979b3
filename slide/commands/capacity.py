"""`slide capacity`: the largest model a machine can fine-tune, per mode: the placement of the
optimizer state and activations (CPU RAM or NVMe) and the Adam moments' precision. Fitting is
decided by the memory ledger alone, beside SlideFormer's host RAM for the mode as its code allocates
it (`slide_ir.planning.slideformer_footprint`)."""

from __future__ import annotations

import argparse
from typing import Any

from slide import json_out
from slide.commands.common import DEFAULT_MACHINE, add_machine_overrides, drive_count
from slide_ir.planning.capacity import capacity, placements
from slide_ir.planning.slideformer_footprint import slideformer_capacity
from slide_ir.specs.config import (
    ACTIVATION_PLACES,
    CLIP_MODES,
    MOMENT_DTYPES,
    OPTIMIZER_PLACES,
    TrainConfig,
)
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.hardware_parts import Machine

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
    parser.add_argument(
        "--moments",
        choices=MOMENT_DTYPES,
        help="only this Adam moment precision [both, as separate modes]",
    )
    parser.add_argument(
        "--clip",
        choices=CLIP_MODES,
        default="global",
        help="gradient clipping, as `slide train --clip` (global holds every host-updated "
        "gradient until the step's norm: 2 B/param more host RAM) [global, train's default]",
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
    moments = [args.moments] if args.moments else list(MOMENT_DTYPES)
    configs = [
        TrainConfig(
            batch=args.batch,
            seq=args.seq,
            activations=a,
            optimizer=o,
            moments_dtype=m,
            clip=args.clip,
        )
        for a, o in wanted
        for m in moments
    ]
    results = [mode_capacity(machine, config) for config in configs]
    out = {"machine": machine.name, "ram_bytes": machine.ram_bytes,
           "nvme_bytes": nvme_bytes(machine), "batch": args.batch, "seq": args.seq,
           "clip": args.clip, "placements": results}  # fmt: skip
    if args.json:
        print(json_out.dumps(out, indent=2))
    else:
        print(render(out))
    return 0


def mode_capacity(machine: Machine, config: TrainConfig) -> dict[str, Any]:
    """`capacity` of one mode with SlideFormer's own count beside the ledger's answer."""
    result = capacity(machine, config)
    return {**result, **slideformer_capacity(machine, config, result["largest_model"])}


def nvme_bytes(machine: Machine) -> int:
    return sum(d.capacity_bytes for d in machine.nvme)


def render(out: dict[str, Any]) -> str:
    drives = f", {out['nvme_bytes'] / 1e9:.0f} GB of NVMe" if out["nvme_bytes"] else ""
    lines = [f"{out['machine']}: batch {out['batch']} x seq {out['seq']}, --clip {out['clip']}; "
             f"{out['ram_bytes'] / 2**30:.0f} GiB of RAM{drives}"]  # fmt: skip
    for r in out["placements"]:
        best = r["largest_model"] or "none"
        per_param = r["host_bytes_per_param"]
        host = f"; host RAM {per_param:.1f} B/param" if per_param is not None else ""
        lines.append(
            f"\n{mode_name(r)}: largest catalog model {best} "
            f"({r['largest_model_params'] / 1e9:.1f} B){host} ({rule_text(r)})"
        )
        for name, f in r["families"].items():
            member = f["largest_member"] or "none"
            scaled = (f"depth-scaled {f['scaled_from']} to {f['scaled_layers']} layers: "
                      f"{f['scaled_params'] / 1e9:.1f} B params" if f["scaled_from"]
                      else "no depth fits")  # fmt: skip
            lines.append(f"  {name:14s} largest member {member:16s} {scaled}")
    return "\n".join(lines)


def mode_name(r: dict[str, Any]) -> str:
    """`activations on cpu, optimizer on cpu, FP32 moments`."""
    return (f"activations on {r['activations']}, optimizer on {r['optimizer']}, "
            f"{r['moments'].upper()} moments")  # fmt: skip


def rule_text(r: dict[str, Any]) -> str:
    """`SlideFormer, as its code allocates: 12.9 B/param; its largest qwen2.5-14b (14.8 B)`."""
    per_param = r["slideformer_host_bytes_per_param"]
    same = f"{per_param:.1f} B/param for the same model; " if per_param else ""
    best = r["slideformer_largest_model"] or "none"
    return (f"SlideFormer, as its code allocates: {same}its largest catalog model {best} "
            f"({r['slideformer_largest_model_params'] / 1e9:.1f} B)")  # fmt: skip
