"""`slide models`: the built-in model catalog."""

from __future__ import annotations

import argparse

from slide_ir.specs.model_catalog import load_model, model_names

NAME = "models"
HELP = "list the built-in model catalog"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    print(f"{'name':18s} {'params':>9s} {'layers':>6s} {'hidden':>6s} {'vocab':>7s}  source")
    for name in model_names():
        m = load_model(name)
        print(
            f"{name:18s} {m.total_params / 1e9:8.2f}B {m.num_layers:6d} {m.hidden_size:6d} "
            f"{m.vocab_size:7d}  {m.source}"
        )
    return 0
