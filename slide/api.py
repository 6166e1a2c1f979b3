"""The public API: the same operations as the command line, for notebooks and scripts.

from slide.api import plan, simulate
p = plan("llama-3.1-8b", "paper-pc-4090", batch=16, seq=1024)
r = simulate("llama-3.1-8b", "paper-pc-4090", batch=16, seq=1024)
r.summary()["tokens_per_s"]
"""

from __future__ import annotations

from typing import Any

from simulator.analyses import batch_sweep, compare, critical_batch, model_sweep, schedule_sweep
from simulator.run import SimResult, simulate_plan
from slide_ir.planning.capacity import capacity
from slide_ir.planning.planner import Plan
from slide_ir.planning.planner import plan as _plan
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine, load_machine
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model


def _inputs(model: str | ModelSpec, machine: str | Machine) -> tuple[ModelSpec, Machine]:
    return (
        load_model(model) if isinstance(model, str) else model,
        load_machine(machine) if isinstance(machine, str) else machine,
    )


def plan(model: str | ModelSpec, machine: str | Machine, **config: Any) -> Plan:
    """Plan with TrainConfig fields as keywords (batch, seq, activations, optimizer, ...)."""
    spec, mach = _inputs(model, machine)
    return _plan(spec, mach, TrainConfig(**config))


def simulate(model: str | ModelSpec, machine: str | Machine, **config: Any) -> SimResult:
    """Plan and simulate; an infeasible plan comes back unsimulated (`result.trace is None`)."""
    spec, mach = _inputs(model, machine)
    return simulate_plan(spec, mach, TrainConfig(**config))


__all__ = [
    "TrainConfig",
    "batch_sweep",
    "capacity",
    "compare",
    "critical_batch",
    "load_machine",
    "load_model",
    "model_sweep",
    "plan",
    "schedule_sweep",
    "simulate",
]
