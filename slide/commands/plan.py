"""`slide plan`: the memory ledger per tier, the verdict, and the schedule graph's shape.

Exit status 1 when the configuration does not fit (the plan is still printed, with its overflow
and suggestions, and written with `--out`), as `slide simulate` does; 2 for a user error.
"""

from __future__ import annotations

import argparse
import json

from slide.commands.common import add_model_machine, add_train_config, load_inputs, train_config
from slide.fileio import write_atomic
from slide.report import plan_summary, render_plan
from slide_ir.planner import plan, plan_to_json

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
    parser.add_argument("--out", help="write the plan (inputs + graph) as JSON to this file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    model, machine = load_inputs(args)
    p = plan(model, machine, train_config(args))
    if args.out:
        write_atomic(args.out, plan_to_json(p))
    if args.json:
        print(json.dumps(plan_summary(p), indent=2))
    else:
        print(render_plan(p))
        if args.out:
            print(f"plan written to {args.out}")
    return 0 if p.feasible else 1
