"""The default placement, judged by the simulator: never slower than any placement the search
considered, and never slower than the default before the search (no resident units, streamed
ones by the closed-form estimate, inputs on the GPU only when they stream) on any catalog
machine preset and model at batch 4-64."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.dram import simulate_shared_dram
from slide_ir import TrainConfig, load_machine, load_model, model_names
from slide_ir.ir.trace import trace_metrics
from slide_ir.planning.cost import CostModel
from slide_ir.planning.ledger import build_ledger
from slide_ir.planning.placement_choice import PlacementChoice
from slide_ir.planning.planner import Plan, plan
from slide_ir.planning.streaming import choose_streamed

PRESETS = ("h200-16c-128g", "paper-pc-4090", "paper-server-a100")
BATCHES = (4, 8, 16, 32, 64)


def simulated_step_s(p: Plan) -> float:
    trace = simulate_shared_dram(p.graph, CostModel(p.machine))
    return trace_metrics(trace).step_time_s


def previous_default(model, machine, config: TrainConfig) -> TrainConfig:
    """The default before the placement search, written out: no resident units, 3 cache units, streamed
    units by the estimate, the inputs on the GPU when it streams with them there and fits."""
    base = replace(config, resident=0, cache_units=3, streamed="auto")
    on_gpu = replace(base, activations="gpu")
    streamed = choose_streamed(model, machine, on_gpu, ())
    if streamed and build_ledger(model, machine, on_gpu, (), streamed).feasible:
        return replace(on_gpu, streamed=len(streamed))
    on_cpu = replace(base, activations="cpu")
    return replace(on_cpu, streamed=len(choose_streamed(model, machine, on_cpu, ())))


@pytest.mark.parametrize(
    ("model", "machine", "batch"),
    [
        ("llama-3.2-3b", "h200-16c-128g", 16),
        ("llama-3.1-8b", "h200-16c-128g", 16),
        ("llama-3.1-8b", "paper-pc-4090", 16),
        ("qwen2.5-14b", "paper-server-a100", 4),
    ],
)
def test_the_choice_is_never_simulated_slower_than_what_it_considered(model, machine, batch):
    spec, mach = load_model(model), load_machine(machine)
    p = plan(spec, mach, TrainConfig(batch=batch, seq=1024))
    chosen = simulated_step_s(p)
    assert chosen == pytest.approx(p.choice.predicted_step_s, rel=1e-12)
    for candidate in p.choice.considered:
        pinned = PlacementChoice(chosen=candidate.placement, how="pinned").resolve(p.config)
        other = simulated_step_s(plan(spec, mach, pinned))
        assert other == pytest.approx(candidate.step_s, rel=1e-12), candidate
        assert chosen <= other * (1 + 1e-8), candidate


@pytest.mark.slow
@pytest.mark.parametrize("machine", PRESETS)
def test_the_default_is_never_slower_than_the_previous_default(machine):
    """Every catalog model at batch 4-64 on every preset: where the previous default fits,
    the new one fits and its simulated step is no longer; where it did not, neither need."""
    mach = load_machine(machine)
    gains = []
    for name in model_names():
        spec = load_model(name)
        for batch in BATCHES:
            config = TrainConfig(batch=batch, seq=1024)
            before = plan(spec, mach, previous_default(spec, mach, config))
            if not before.feasible:
                continue
            now = plan(spec, mach, config)
            assert now.feasible, (name, batch)
            old, new = simulated_step_s(before), simulated_step_s(now)
            assert new <= old * (1 + 1e-8), (name, batch, new, old)
            gains.append(old / new)
    assert gains and max(gains) > 1.05  # the search changed something on every preset
