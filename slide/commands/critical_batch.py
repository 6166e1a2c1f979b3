"""`slide critical-batch`: the batch from which offloading is free on this machine.

Two definitions, both reported: `critical_batch`, the smallest batch with eta = T_bwd / (T_d2h +
T_update) >= 1 in the steady-state backward (per decoder layer, as the SlideFormer paper defines
it), and `critical_batch_util97`, the smallest at which the GPU is busy >= 97% of the backward
phase (the pipeline is full in practice, cache-unit and buffer stalls included).
"""

from __future__ import annotations

import argparse

from simulator.analyses import MAX_BATCH, CriticalBatch, critical_batch
from slide import json_out
from slide.commands.common import add_model_machine, add_train_config, load_inputs, train_config

NAME = "critical-batch"
HELP = "smallest batch at which the CPU update hides behind the GPU backward (eta >= 1)"
PLACEMENT_NOTE = {"small": ": every unit sliding; --placement fast for the default placement"}
POINT_KEYS = ("batch", "feasible", "eta", "gpu_bwd_util", "tokens_per_s", "step_time_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_machine(parser)
    add_train_config(parser, batch=False)
    parser.add_argument(
        "--max-batch", type=int, default=MAX_BATCH, help=f"largest batch searched [{MAX_BATCH}]"
    )
    parser.add_argument(
        "--ignore-memory",
        action="store_true",
        help="simulate batches that do not fit as if they did (eta is a cost "
        "ratio: where is the crossover, whatever the GPU holds)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    # searched; train_config needs a starting value. The question is the sliding pipeline's
    # (SlideFormer's critical batch): with the fastest placement a small batch fits whole on a
    # large GPU and there is nothing to hide, so the sliding placement is the default here
    parser.set_defaults(batch=1, placement="small")


def run(args: argparse.Namespace) -> int:
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {args.max_batch}")
    model, machine = load_inputs(args)
    found = critical_batch(
        model,
        machine,
        train_config(args),
        max_batch=args.max_batch,
        ignore_memory=args.ignore_memory,
    )
    points = [{k: p.get(k) for k in POINT_KEYS} for _, p in sorted(found.points.items())]
    out = {
        "model": model.name,
        "machine": machine.name,
        "seq": args.seq,
        "schedule": args.schedule,
        "placement": args.placement,
        "critical_batch": found.critical_batch,
        "critical_batch_util97": found.critical_batch_util97,
        "max_feasible_batch": found.max_feasible_batch,
        "ignore_memory": found.ignore_memory,
        "points": points,
    }
    # no batch fits: a result like an infeasible plan's (exit 1), not a user error
    code = 0 if found.max_feasible_batch or found.ignore_memory else 1
    if args.json:
        print(json_out.dumps(out, indent=2))
        return code
    print(f"{model.name} on {machine.name}, seq {args.seq} ({args.schedule}, placement "
          f"{args.placement}{PLACEMENT_NOTE.get(args.placement, '')})")  # fmt: skip
    print(f"critical batch (eta >= 1):              {_fmt(found.critical_batch, found)}")
    print(f"critical batch (GPU backward >= 97%):   {_fmt(found.critical_batch_util97, found)}")
    print(f"largest batch that fits:                {found.max_feasible_batch or 'none'}"
          + ("" if code == 0 else f" (not even batch 1: slide plan --model {model.name} "
             f"--machine {machine.name} --batch 1 says what overflows)"))  # fmt: skip
    print("batches evaluated:")
    for p in points:
        if not p["feasible"]:
            print(f"  batch {p['batch']:4d}  does not fit")
            continue
        eta = "n/a" if p["eta"] is None else f"{p['eta']:.3f}"
        print(
            f"  batch {p['batch']:4d}  eta {eta:>5s}  GPU in backward {p['gpu_bwd_util']:.1%}"
            f"  {p['tokens_per_s']:,.0f} tokens/s"
        )
    return code


def _fmt(batch: int | None, found: CriticalBatch) -> str:
    if batch is not None:
        return str(batch)
    if not found.max_feasible_batch and not found.ignore_memory:
        return "none: no batch fits"
    return f"not reached up to the largest batch that fits ({found.max_feasible_batch})"
