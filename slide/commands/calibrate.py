"""`slide calibrate`: measure this CUDA machine and write a machine profile (TOML) whose every
figure says `measured: <device>, <date>` and how. `plan`, `simulate` and `train` accept it, and
it also becomes this host's `--machine auto` profile (`slide.calibration.auto_machine`'s cache entry)."""

from __future__ import annotations

import argparse
import datetime
import platform
from dataclasses import replace
from pathlib import Path

from slide import preflight
from slide.errors import UserError
from slide.fileio import write_atomic
from slide_ir.specs.hardware import machine_to_toml

NAME = "calibrate"
HELP = "measure this CUDA machine's rates and write a machine profile (TOML)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="llama-3.1-8b", help="layer shapes to time [llama-3.1-8b]"
    )
    parser.add_argument("--nvme-dir", help="a directory on the NVMe drive to measure (optional)")
    parser.add_argument("--name", help="machine name in the profile [hostname]")
    parser.add_argument("--out", required=True, help="profile to write (.toml)")


def run(args: argparse.Namespace) -> int:
    import torch

    from slide.calibration import auto_machine, host_probes

    preflight.output_file("--out", args.out, ("toml",))
    if not torch.cuda.is_available():
        raise UserError("calibrate needs a CUDA GPU; none is visible here")
    sizes = replace(host_probes.CALIBRATE, model=args.model)
    host = host_probes.this_host(torch.device("cuda"))
    stamp = f"measured: {host.gpu}, {datetime.date.today().isoformat()}, slide calibrate"
    nvme_dir = Path(args.nvme_dir) if args.nvme_dir else None
    got = host_probes.run_probes(host_probes.probe_table(sizes, host, nvme_dir), progress=True)
    name = args.name or platform.node() or "calibrated"
    machine = host_probes.profile(name, host, got, stamp, nvme_dir)
    header = host_probes.header("slide calibrate", got)
    write_atomic(args.out, header + machine_to_toml(machine))
    print(f"profile written to {args.out}")
    cached = auto_machine.store(host, machine, header)
    if cached is not None:
        print(f"--machine auto on this host now plans with it (cached as {cached})")
    return 0
