"""Simulator vs executor: predicted against measured, per configuration and per op kind.

Input: measured traces (from bench/speed/train_throughput.py --traces; they carry the executor's memory
samples) and a machine profile (the calibrated one). Each measured trace's plan is
re-planned with the profile and simulated; the script prints markdown tables:
- per configuration: step time, eta, GPU peak, CPU peak (predicted vs measured, error), the
  per-lane busy-time error, and the spread of the host update's busy time over the steps (a
  large one flags a run the host disturbed);
- per op kind: measured / predicted mean duration (which cost-model term is off).

    python -m bench.speed.accuracy --traces traces/ --machine h200.toml
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from simulator.run import simulate_plan
from slide_ir.ir.graph import OpKind, load_versioned
from slide_ir.ir.trace import Trace, trace_metrics
from slide_ir.planning.compute_terms import CUDA_CONTEXT_BYTES
from slide_ir.planning.planner import PLAN_VERSION
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine


def busy(trace: Trace, steps: set[int]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for s in trace.spans:
        if s.step in steps:
            out[s.lane] += s.end - s.start
    return dict(out)


def update_spread(trace: Trace, steps: set[int]) -> float:
    """(max - min) / median of the `cpu` lane's busy seconds per step: every step updates the
    same units, so a spread says the host was disturbed during the run, not the model off."""
    per: dict[int, float] = defaultdict(float)
    for s in trace.spans:
        if s.step in steps and s.lane == "cpu":
            per[s.step] += s.end - s.start
    if not per:
        return 0.0
    values = list(per.values())
    return (max(values) - min(values)) / statistics.median(values)


def kind_means(trace: Trace, steps: set[int]) -> dict[str, float]:
    per: dict[str, list[float]] = defaultdict(list)
    for s in trace.spans:
        if s.step in steps:
            per[str(s.kind)].append(s.end - s.start)
    return {k: statistics.mean(v) for k, v in per.items()}


def measured_config(trace_path: Path) -> tuple[TrainConfig, str]:
    """The TrainConfig a trace was measured with: from the plan saved beside it, with the
    resident and streamed counts its plan chose
    (`x.plan.json`), else (traces of 2026-11-29's first run) from the name's `_r<resident>`."""
    stem = trace_path.name.removesuffix(".trace.json")
    plan_path = trace_path.with_name(f"{stem}.plan.json")
    if plan_path.exists():
        return saved_config(plan_path.read_text()), stem.split("_", 2)[2]
    info = Trace.from_json(trace_path.read_text()).info
    resident = stem.split("_r")[-1]
    value: int | str = "auto" if resident == "auto" else int(resident)
    config = TrainConfig(batch=info.batch, seq=info.seq, steps=info.steps, resident=value)
    return config, f"r{resident}"


def saved_config(plan_json: str) -> TrainConfig:
    """A saved plan's TrainConfig with the resident and streamed counts its graph holds (not
    "auto": a new profile may choose others). Read from the JSON without re-planning or
    parsing the graph, so plans saved by an older planner and graph format still load."""
    data = load_versioned(plan_json, PLAN_VERSION, "plan")
    graph = data["graph"]  # the raw ops: graph format 1 (2026-11-29/30) named a unit `layer`
    units = {
        kind: {op.get("unit", op.get("layer")) for op in graph["ops"] if op["kind"] == kind}
        for kind in (OpKind.OPT_H2D, OpKind.GPU_ADAM)
    }
    streamed = units[OpKind.OPT_H2D]
    on_gpu = units[OpKind.GPU_ADAM] - streamed
    resident = len(on_gpu) if graph["info"]["schedule"] == "sliding" else 0
    return replace(TrainConfig(**data["config"]), resident=resident, streamed=len(streamed))


def err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+.1%}" if meas else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--machine", required=True)
    args = ap.parse_args()
    machine = load_machine(args.machine)
    ratios: dict[str, list[float]] = defaultdict(list)
    print(
        "| config | step time pred / meas | eta pred / meas | GPU peak pred / meas | CPU peak pred / meas | lane busy error | host update spread |"
    )
    print("|---|---|---|---|---|---|---|")
    for path in sorted(args.traces.glob("*.trace.json")):
        measured = Trace.from_json(path.read_text())
        info = measured.info
        config, label = measured_config(path)
        sim = simulate_plan(info.model, machine, config, force=True)
        assert sim.trace is not None
        pm, mm = trace_metrics(sim.trace, sim.plan.graph), trace_metrics(measured, sim.plan.graph)
        steady = set(mm.steady_steps)
        pb, mb = busy(sim.trace, steady), busy(measured, steady)
        lanes = ", ".join(f"{lane} {err(pb.get(lane, 0), mb[lane])}" for lane in sorted(mb))
        # GPU: the ledger less the CUDA context (max_memory_allocated does not see it) against the
        # executor's own samples (allocator peak per step); CPU: the ledger against its RSS samples
        gpu_pred = sim.plan.ledger.peak_bytes("gpu") - CUDA_CONTEXT_BYTES
        cpu_pred = sim.plan.ledger.peak_bytes("cpu")
        gpu_meas, cpu_meas = mm.peak_bytes.get("gpu", 0), mm.peak_bytes.get("host", 0)
        print(
            f"| {info.model} b{info.batch} {label} "
            f"| {pm.step_time_s:.3f} / {mm.step_time_s:.3f} ({err(pm.step_time_s, mm.step_time_s)}) "
            f"| {pm.eta:.2f} / {mm.eta:.2f} ({err(pm.eta, mm.eta)}) "
            f"| {gpu_pred / 2**30:.1f} / {gpu_meas / 2**30:.1f} GiB ({err(gpu_pred, gpu_meas)}) "
            f"| {cpu_pred / 2**30:.1f} / {cpu_meas / 2**30:.1f} GiB ({err(cpu_pred, cpu_meas)}) "
            f"| {lanes} | {update_spread(measured, steady):.0%} |"
        )
        pk, mk = kind_means(sim.trace, steady), kind_means(measured, steady)
        for kind, value in mk.items():
            if pk.get(kind):
                ratios[kind].append(value / pk[kind])
    print("\n| op kind | measured / predicted duration (median over configs) | min | max |")
    print("|---|---|---|---|")
    for kind, values in sorted(ratios.items()):
        print(
            f"| {kind} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"
        )


if __name__ == "__main__":
    main()
