"""How fast the simulator answers what-ifs: plan + simulate one run, and a 100-point sweep.

Targets: mistral-large-2 (88 layers), 3 steps, plan + simulate in under 1 s; a
100-point sweep in under 30 s on a 2-core machine. Prints one line per figure; record them in
bench/RESULTS.md ("## Simulator speed") with the date and machine.

    python bench/planning/simulator_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from simulator.dram import simulate_shared_dram
from slide.commands.sweep import simulate_points
from slide_ir.ir.trace import trace_metrics
from slide_ir.planning.cost import CostModel
from slide_ir.planning.planner import plan
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model

MACHINE = "paper-server-a100"
RAM_GB = 2048  # mistral-large-2's optimizer state needs ~1.7 TB of RAM: make the plan fit


def one_run(repeat: int) -> None:
    model, machine = load_model("mistral-large-2"), load_machine(MACHINE, ram_gb=RAM_GB)
    config = TrainConfig(batch=8, seq=1024, steps=3)
    best = {"plan": 1e9, "simulate": 1e9, "metrics": 1e9}
    first = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = plan(model, machine, config)
        t1 = time.perf_counter()
        trace = simulate_shared_dram(p.graph, CostModel(machine))
        t2 = time.perf_counter()
        trace_metrics(trace, p.graph)
        t3 = time.perf_counter()
        for key, dt in (("plan", t1 - t0), ("simulate", t2 - t1), ("metrics", t3 - t2)):
            best[key] = min(best[key], dt)
        first = first or t3 - t0
    total = sum(best.values())
    print(
        f"mistral-large-2 on {MACHINE} ({RAM_GB} GB RAM), batch 8 x seq 1024, 3 steps: {len(p.graph.ops)} ops, "
        f"{len(trace.spans)} spans, feasible {p.feasible}"
    )
    print(
        f"  plan {best['plan']:.3f} s + simulate {best['simulate']:.3f} s + metrics "
        f"{best['metrics']:.3f} s = {total:.3f} s (best of {repeat}; first run {first:.3f} s; "
        "target < 1 s)"
    )


def sweep() -> None:
    """100 points: 5 models x 20 batches, each planned and simulated (3 steps), as `slide sweep`
    runs them (`simulate_points`): in one process, then in one per core."""
    machine = load_machine(MACHINE)
    models = [
        load_model(m)
        for m in ("qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b")
    ]
    points = [
        (model, machine, TrainConfig(batch=b, seq=1024, steps=3), None)
        for model in models
        for b in range(2, 42, 2)
    ]
    for jobs in sorted({1, os.cpu_count() or 1}):
        t0 = time.perf_counter()
        rows = simulate_points(points, jobs=jobs)
        dt = time.perf_counter() - t0
        print(
            f"sweep, {jobs} process{'es' if jobs > 1 else ''}: {len(rows)} points (qwen2.5 "
            f"3b..72b x batch 2..40, {sum(r['feasible'] for r in rows)} fit and were simulated)"
            f" in {dt:.2f} s, {dt / len(rows) * 1e3:.0f} ms per point (target < 30 s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, {platform.platform()}"
    )
    one_run(args.repeat)
    sweep()


if __name__ == "__main__":
    main()
