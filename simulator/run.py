"""Plan + simulate in one call, and the result every command and analysis reads.

`simulate_plan` plans (model, machine, config) with the planner, refuses to simulate a plan whose
ledger overflows (the result then says which tier overflows, by how much), and otherwise runs the
engine with a `CostModel` for the machine. `SimResult.summary()` is the flat dict with the names
the command line prints as JSON (`step_time_s`, `tokens_per_s`, `eta`, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simulator.dram import simulate_shared_dram
from slide_ir.ir.trace import Metrics, Trace, trace_metrics
from slide_ir.planning.cost import CostModel
from slide_ir.planning.ledger import REPORT_TIERS
from slide_ir.planning.machine_rates import Efficiency
from slide_ir.planning.planner import Plan, plan
from slide_ir.planning.programs import eval_graph
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine, load_machine
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model


@dataclass(frozen=True, kw_only=True, slots=True)
class SimResult:
    plan: Plan
    trace: Trace | None  # None when the plan is infeasible
    metrics: Metrics | None
    eval_batch_s: float | None = None  # an eval batch's forward-only pass, steady (`eval_seconds`)

    @property
    def feasible(self) -> bool:
        return bool(self.plan.feasible)

    def summary(self) -> dict[str, Any]:
        """Flat, JSON-ready figures (eta is null when nothing is offloaded)."""
        info = self.plan.graph.info
        ledger = self.plan.ledger
        out: dict[str, Any] = {
            "model": info.model,
            "machine": info.machine,
            "schedule": info.schedule,
            "batch": info.batch,
            "seq": info.seq,
            "steps": info.steps,
            "params": info.params,
            "feasible": self.feasible,
            "overflows": [{"tier": t, "bytes_over": int(b)} for t, b in ledger.overflows()],
            "ledger": {t: int(ledger.peak_bytes(t)) for t in REPORT_TIERS},
            "capacity": {t: int(ledger.capacity_bytes(t)) for t in REPORT_TIERS},
            "placement": choice.summary(self.plan.model) if (choice := self.plan.choice) else None,
        }
        if self.metrics is not None:
            out.update(_metric_fields(self.metrics))
            out["eval_batch_s"] = self.eval_batch_s
        return out


def _metric_fields(m: Metrics) -> dict[str, Any]:
    return {
        "step_time_s": m.step_time_s,
        "first_step_s": m.first_step_s,
        "tokens_per_s": m.tokens_per_s,
        "tflops": m.tflops,
        "tflops_6n": m.tflops_6n,
        "tflops_8n": m.tflops_8n,
        "eta": _finite(m.eta),
        "eta_min": _finite(m.eta_min),
        "t_bwd_s": m.t_bwd_s,
        "t_d2h_s": m.t_d2h_s,
        "t_update_s": m.t_update_s,
        "gpu_util": m.gpu_util,
        "gpu_bwd_util": m.gpu_bwd_util,
        "lane_util": dict(m.lane_util),
        "bottleneck": m.bottleneck,
        "critical_path_s": dict(m.critical_path),
        "memory": simulated_memory(m),
        "memory_pinned": m.peak_bytes.get("pinned", 0),
        "compute_only_tokens_per_s": m.compute_only_tokens_per_s,
    }


def simulated_memory(m: Metrics) -> dict[str, int]:
    """Simulated peaks in the ledger's tiers: `cpu` is all host RAM (pinned + pageable)."""
    return {
        "gpu": m.peak_bytes.get("gpu", 0),
        "cpu": m.peak_bytes.get("host", 0),
        "nvme": m.peak_bytes.get("nvme", 0),
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def resolve_model(model: str | ModelSpec) -> ModelSpec:
    return load_model(model) if isinstance(model, str) else model


def resolve_machine(machine: str | Machine, **overrides: Any) -> Machine:
    return load_machine(machine, **overrides) if isinstance(machine, str) else machine


def simulate_plan(
    model: str | ModelSpec,
    machine: str | Machine,
    config: TrainConfig,
    *,
    efficiency: Efficiency | None = None,
    force: bool = False,
) -> SimResult:
    """Plan, and simulate when the plan fits. `force` simulates an overflowing plan too, for
    what-if timing only (the result still reports `feasible: false` and the overflow)."""
    spec, mach = resolve_model(model), resolve_machine(machine)
    p = plan(spec, mach, config)
    if not p.feasible and not force:
        return SimResult(plan=p, trace=None, metrics=None)
    costs = CostModel(mach, cpu_threads=config.cpu_threads, efficiency=efficiency)
    trace = simulate_shared_dram(p.graph, costs, meta={"cost_model": costs.describe()})
    return SimResult(plan=p, trace=trace, metrics=trace_metrics(trace, p.graph),
                     eval_batch_s=eval_seconds(p, costs))  # fmt: skip


EVAL_SIMULATED = 3  # eval batches simulated: the first pays the pipeline's fill


def eval_seconds(p: Plan, costs: CostModel) -> float:
    """Seconds of one eval batch (`slide train --eval-data`: the forward-only graph on the
    plan's pools), in the steady state: between the ends of the first and the last of
    `EVAL_SIMULATED` batches, per batch."""
    trace = simulate_shared_dram(eval_graph(p, EVAL_SIMULATED), costs)
    ends = [max(s.end for s in trace.spans if s.step == k) for k in (1, EVAL_SIMULATED)]
    return (ends[1] - ends[0]) / (EVAL_SIMULATED - 1)
