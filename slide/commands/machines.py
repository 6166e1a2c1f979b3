"""`slide machines`: the built-in machine presets."""

from __future__ import annotations

import argparse

from slide_ir.specs.hardware import load_machine, machine_names

NAME = "machines"
HELP = "list the built-in machine presets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    print(f"{'name':20s} {'gpu':10s} {'GB':>5s} {'cpu':16s} {'RAM GB':>7s} {'nvme':>4s}")
    for name in machine_names():
        m = load_machine(name)
        print(
            f"{name:20s} {m.gpu.name:10s} {m.gpu.memory_bytes / 1e9:5.0f} {m.cpu.name:16s} "
            f"{m.ram_bytes / 1e9:7.0f} {len(m.nvme):4d}"
        )
    return 0
