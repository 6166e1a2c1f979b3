"""`slide plan`: the memory ledger per tier, the verdict, and the schedule graph's shape.

Exit status 1 when the configuration does not fit (the plan is still printed, with its overflow
and suggestions, and written with `--out`), as `slide simulate` does; 2 for a user error.
"""

from __future__ import annotations

import argparse

from slide import json_out, preflight
from slide.commands.common import (
    add_model_machine,
    add_train_config,
    load_inputs,
    nvme_dirs,
    train_config,
)
from slide.errors import UserError
from slide.fileio import write_atomic
from slide.report import plan_summary, render_plan
from slide.report_dp import dp_plan_summary, render_dp_plan
from slide_ir.planning.data_parallel import plan_data_parallel
from slide_ir.planning.planner import plan, plan_to_json

NAME = "plan"
HELP = "plan a fine-tuning run: memory per tier, whether it fits, the schedule"
EXIT_CODES = (
    "exit status: 0 the plan fits; 1 it does not fit (the plan is still printed, with what "
    "overflows and what would fit); 2 a user error (bad name, value or file)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES
    add_model_machine(parser)
    add_train_config(parser)
    add_nproc(parser)
    parser.add_argument("--out", help="write the plan (inputs + graph) as JSON to this file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_nproc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="data-parallel ranks (GPUs of one node, 1 to 8): --batch is then the global batch, "
        "each rank taking batch / nproc, and the optimizer state is sharded over the ranks [1]",
    )


def run(args: argparse.Namespace) -> int:
    preflight.output_file("--out", args.out)
    if args.nproc != 1:
        return _run_data_parallel(args)
    model, machine = load_inputs(args)
    p = plan(model, machine, train_config(args))
    if args.out:
        write_atomic(args.out, plan_to_json(p))
    if args.json:
        print(json_out.dumps(plan_summary(p), indent=2))
    else:
        print(render_plan(p, nvme_dirs(args)))
        if args.out:
            print(f"plan written to {args.out}")
    return 0 if p.feasible else 1


def _run_data_parallel(args: argparse.Namespace) -> int:
    if args.out:
        raise UserError("--out saves single-GPU plans only: drop --out, or --nproc")
    model, machine = load_inputs(args)
    dp = plan_data_parallel(model, machine, train_config(args), args.nproc)
    print(json_out.dumps(dp_plan_summary(dp), indent=2) if args.json else render_dp_plan(dp))
    return 0 if dp.feasible else 1
