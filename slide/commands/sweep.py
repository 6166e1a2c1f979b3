"""`slide sweep`: throughput, eta and memory over a grid of batches, models, drives, schedules.

Every comma list is one axis (`--batch 1,2,4,8`, `--model qwen2.5-3b,qwen2.5-7b`, `--nvme 1,2,4`,
`--schedules sliding,zero-offload`); the grid is their product. Prints a table (or JSON), shows
a progress bar on stderr, and with `--plot FILE` draws the rows against the first axis with more
than one value (one line per value of the other varying axes: a model, a schedule, "2 drives").
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from tqdm import tqdm

from simulator.run import simulate_plan
from slide import json_out, preflight
from slide.commands.common import (
    DEFAULT_MACHINE,
    DEFAULT_MODEL,
    RAM_GB_HELP,
    add_train_config,
    train_config,
)
from slide_ir.specs.config import SCHEDULES, TrainConfig
from slide_ir.specs.hardware import Machine, load_machine
from slide_ir.specs.hardware_parts import GIB
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model

NAME = "sweep"
HELP = "simulate a grid of batches / models / NVMe drives / schedules: a table, a plot on request"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"comma list of models [{DEFAULT_MODEL}]"
    )
    parser.add_argument("--machine", default=DEFAULT_MACHINE, help=f"machine [{DEFAULT_MACHINE}]")
    parser.add_argument("--ram-gb", type=float, help=RAM_GB_HELP)
    parser.add_argument("--nvme", help="comma list of NVMe drive counts (overrides the machine)")
    parser.add_argument("--batch", default="1,2,4,8,16,32,64", help="comma list [1,2,4,8,16,32,64]")
    add_train_config(parser, batch=False)
    parser.add_argument("--schedules", help=f"comma list of schedules ({', '.join(SCHEDULES)})")
    parser.add_argument("--plot", metavar="PNG", help="write a plot of the rows to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes simulating points side by side [this machine's cores]")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


Point = tuple[ModelSpec, Machine, TrainConfig, int | None]  # model, machine, config, drives


def simulate_points(
    points: list[Point], *, jobs: int, progress: bool = False
) -> list[dict[str, Any]]:
    """Each point planned (the placement search) and simulated, in order: in `jobs` processes
    where there are several points, since points share nothing and the search is pure Python
    (spawned, so that no thread of the caller is copied into them)."""
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    bar = {"desc": "sweep", "unit": "point", "disable": not progress, "total": len(points)}
    if jobs == 1 or len(points) < 2:
        return [simulate_point(p) for p in tqdm(points, **bar)]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(points)), mp_context=spawn) as pool:
        return list(tqdm(pool.map(simulate_point, points), **bar))


def simulate_point(point: Point) -> dict[str, Any]:
    model, machine, config, drives = point
    return {"nvme_drives": drives, **simulate_plan(model, machine, config).summary()}


def int_list(name: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be a comma list of integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise ValueError(f"--{name} must be a comma list of integers >= 0, got {text!r}")
    return values


def _axes(args: argparse.Namespace) -> dict[str, list[Any]]:
    schedules = args.schedules.split(",") if args.schedules else [args.schedule]
    for s in schedules:
        if s not in SCHEDULES:
            raise ValueError(f"--schedules: each must be one of {', '.join(SCHEDULES)}; got {s!r}")
    return {
        "batch": int_list("batch", args.batch),
        "model": [m for m in args.model.split(",") if m],
        "nvme_drives": int_list("nvme", args.nvme) if args.nvme else [None],
        "schedule": schedules,
    }


def run(args: argparse.Namespace) -> int:
    preflight.image_file("--plot", args.plot)
    axes = _axes(args)
    models = {m: load_model(m) for m in axes["model"]}
    machines = {
        n: load_machine(args.machine, ram_gb=args.ram_gb, nvme=n) for n in axes["nvme_drives"]
    }
    base = train_config(args, batch=axes["batch"][0])
    grid = list(
        itertools.product(axes["model"], axes["nvme_drives"], axes["schedule"], axes["batch"])
    )
    points = [
        (models[model], machines[drives], replace(base, batch=batch, schedule=schedule), drives)
        for model, drives, schedule, batch in grid
    ]
    rows = simulate_points(points, jobs=args.jobs, progress=not args.no_progress)
    x = next(
        (k for k in ("batch", "model", "nvme_drives", "schedule") if len(axes[k]) > 1), "batch"
    )
    varying = [k for k in ("model", "schedule", "nvme_drives") if k != x and len(axes[k]) > 1]
    for r in rows:
        r["series"] = " ".join(series_label(k, r[k]) for k in varying)
    if args.json:
        print(json_out.dumps(rows, indent=2))
    else:
        print(render_table(rows))
    if args.plot:
        from slide.gantt import plot_sweep

        plot_sweep(
            rows,
            args.plot,
            x=x,
            series="series" if varying else None,
            title=f"{args.machine}: seq {args.seq}",
        )
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def series_label(key: str, value: object) -> str:
    """A legend's name for one value of a varying axis: "qwen2.5-3b", "sliding", "2 drives"."""
    if key == "nvme_drives":
        return f"{value} drive" if value == 1 else f"{value} drives"
    return str(value)


COLUMNS = (
    "model",
    "schedule",
    "nvme_drives",
    "batch",
    "step_time_s",
    "tokens_per_s",
    "compute_only_tokens_per_s",
    "eta",
    "gpu_util",
    "bottleneck",
    "gpu_gib",
    "cpu_gib",
)
# each float column's format: GiB as `slide plan` prints memory; tokens/s with no decimals
# that could read as a thousands separator
FORMATS = {"step_time_s": ".3f", "eta": ".2f", "gpu_util": ".0%", "gpu_gib": ".2f",
           "cpu_gib": ".2f"}  # fmt: skip


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = [" ".join(f"{c:>14s}" for c in COLUMNS)]
    for r in rows:
        cells = {**r, "gpu_gib": r["ledger"]["gpu"] / GIB, "cpu_gib": r["ledger"]["cpu"] / GIB}
        if not r["feasible"]:
            over = ", ".join(f"{o['tier']} +{o['bytes_over'] / GIB:.1f} GiB"
                             for o in r["overflows"])  # fmt: skip
            lead = " ".join(_cell(c, cells.get(c)) for c in COLUMNS[:4])
            lines.append(f"{lead} {'does not fit: ' + over:>14s}")
            continue
        lines.append(" ".join(_cell(c, cells.get(c)) for c in COLUMNS))
    return "\n".join(lines)


def _cell(column: str, v: object) -> str:
    if v is None:
        return f"{'-':>14s}"
    if isinstance(v, float):
        return f"{v:>14{FORMATS.get(column, ',.0f')}}"
    return f"{v!s:>14s}"
