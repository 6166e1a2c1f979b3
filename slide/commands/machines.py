"""`slide machines`: the built-in machine presets (memory in GiB, as the catalog gives it:
a "24 GB" RTX 4090 is 24 GiB, which 1e9-byte gigabytes would print as 26)."""

from __future__ import annotations

import argparse

from slide_ir.specs.hardware import load_machine, machine_names
from slide_ir.specs.hardware_parts import GIB

NAME = "machines"
HELP = "list the built-in machine presets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    print(f"{'name':20s} {'gpu':10s} {'GiB':>5s} {'cpu':16s} {'RAM GiB':>7s} {'nvme':>4s}")
    for name in machine_names():
        m = load_machine(name)
        print(
            f"{name:20s} {m.gpu.name:10s} {m.gpu.memory_bytes / GIB:5.0f} {m.cpu.name:16s} "
            f"{m.ram_bytes / GIB:7.0f} {len(m.nvme):4d}"
        )
    return 0
