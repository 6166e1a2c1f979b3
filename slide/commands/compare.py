"""`slide compare`: which machine fine-tunes a model fastest, and fastest per dollar."""

from __future__ import annotations

import argparse
from typing import Any

from simulator.analyses import compare
from slide import json_out
from slide.commands.common import DEFAULT_MODEL, add_train_config, train_config
from slide.errors import UserError
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.hardware_parts import GIB
from slide_ir.specs.model_catalog import load_model

NAME = "compare"
HELP = "rank machines by simulated throughput (and throughput per dollar) for one model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model [{DEFAULT_MODEL}]")
    parser.add_argument(
        "--machine",
        action="append",
        default=[],
        help="a machine to compare (repeat the flag, or a comma list)",
    )
    add_train_config(parser)
    parser.add_argument("--json", action="store_true", help="print the ranking as JSON")


def run(args: argparse.Namespace) -> int:
    names = [n for flag in args.machine for n in flag.split(",") if n]
    if not names:
        raise UserError("give at least one --machine (see `slide machines`)")
    machines = [load_machine(n) for n in dict.fromkeys(names)]
    rows = compare(load_model(args.model), machines, train_config(args))
    if args.json:
        print(json_out.dumps(rows, indent=2))
    else:
        print(render(rows))
    return 0


def render(rows: list[dict[str, Any]]) -> str:
    r0 = rows[0]
    lines = [
        f"{r0['model']}: {r0['schedule']}, batch {r0['batch']} x seq {r0['seq']}",
        f"{'rank':>4s} {'machine':24s} {'tokens/s':>10s} {'eta':>6s} {'bottleneck':>10s} "
        f"{'price $':>9s} {'tok/s per k$':>12s}",
    ]
    for r in rows:
        if not r["feasible"]:
            over = ", ".join(
                f"{o['tier']} +{o['bytes_over'] / GIB:.1f} GiB" for o in r["overflows"]
            )
            lines.append(f"{r['rank']:>4d} {r['machine']:24s} does not fit ({over})")
            continue
        eta = "n/a" if r["eta"] is None else f"{r['eta']:.2f}"  # no layer updates on the host
        price = f"{r['price_usd']:,.0f}" if r["price_usd"] else "-"
        per = f"{1000 * r['tokens_per_s_per_usd']:.2f}" if r["tokens_per_s_per_usd"] else "-"
        lines.append(
            f"{r['rank']:>4d} {r['machine']:24s} {r['tokens_per_s']:>10,.0f} {eta:>6s} "
            f"{r['bottleneck']:>10s} {price:>9s} {per:>12s}"
        )
    return "\n".join(lines)
