"""The planner's timeline (slide_ir.planning.timeline) is the simulator's prediction, op for op: the
placement search ranks candidates with it, so it must not differ from `slide simulate`."""

from __future__ import annotations

import pytest

from simulator.dram import simulate_shared_dram
from simulator.engine import simulate
from slide_ir import TrainConfig, load_machine, load_model
from slide_ir.ir.printing import parse_graph
from slide_ir.ir.trace import trace_metrics
from slide_ir.planning.cost import CostModel, FixedCosts
from slide_ir.planning.planner import plan
from slide_ir.planning.timeline import predict, predict_step_s, step_time_s, timeline

CASES = {
    "searched-8b-h200": ("llama-3.1-8b", "h200-16c-128g", {}),
    "streamed-3b-h200": ("llama-3.2-3b", "h200-16c-128g", {"resident": 0}),
    "small-3b-4090": ("llama-3.2-3b", "paper-pc-4090", {"placement": "small"}),
    # every upload cast from the master into the weight ring on the cpu lane, deferred updates
    "cast-small-clip-accum-4090": (
        "llama-3.2-3b",
        "paper-pc-4090",
        {"placement": "small", "host_weights": "cast", "clip": "global", "grad_accum": 2},
    ),
    "cast-searched-8b-h200": ("llama-3.1-8b", "h200-16c-128g", {"host_weights": "cast"}),
    "nvme-state-and-inputs": (
        "qwen2.5-3b",
        "paper-pc-4090",
        {"optimizer": "nvme", "activations": "nvme", "drives": 2},
    ),
    "accum-resident": ("llama-3.2-1b", "paper-server-a100", {"grad_accum": 2, "resident": 4}),
    "zero-offload": ("llama-3.2-1b", "paper-pc-4090", {"schedule": "zero-offload"}),
    "gpu-only": ("qwen2.5-0.5b", "paper-pc-4090", {"schedule": "gpu-only"}),
    "global-clip-searched-8b": ("llama-3.1-8b", "h200-16c-128g", {"clip": "global"}),
    "global-clip-nvme-accum": (
        "qwen2.5-3b",
        "paper-pc-4090",
        {"clip": "global", "optimizer": "nvme", "grad_accum": 2, "drives": 2},
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def planned(request):
    model, machine, extra = CASES[request.param]
    extra = dict(extra)
    drives = extra.pop("drives", None)
    mach = load_machine(machine, nvme=drives)
    p = plan(load_model(model), mach, TrainConfig(batch=8, seq=1024, steps=3, **extra))
    assert p.feasible, p.ledger.overflows()
    return p, CostModel(mach)


def _times(trace):
    return {s.op_id: (s.start, s.end) for s in trace.spans}


def test_timeline_is_the_engine_op_for_op(planned):
    p, costs = planned
    assert _times(timeline(p.graph, costs)) == _times(simulate(p.graph, costs))


def test_prediction_is_the_simulators_with_shared_dram(planned):
    p, costs = planned
    ours, theirs = predict(p.graph, costs), simulate_shared_dram(p.graph, costs)
    assert _times(ours) == _times(theirs)
    assert step_time_s(ours) == predict_step_s(p.graph, costs)
    assert predict_step_s(p.graph, costs) == trace_metrics(theirs, p.graph).step_time_s


def test_hand_timed_schedule():
    """Two lanes, cross-lane dependencies and FIFO lanes, by hand: the upload waits for the
    forward (3 s), the backward for the upload (5 s), and the embedding's upload, free of
    dependencies, for its lane (5 s)."""
    g = parse_graph(
        """
info schedule=sliding model=m machine=m batch=1 seq=8 steps=1 grad_accum=1 num_layers=1 params=1 flops_per_step=1
op s1.L1.fwd kind=fwd lane=gpu step=1 unit=1
op s1.L1.w.h2d kind=h2d_param lane=h2d step=1 unit=1 deps=s1.L1.fwd
op s1.L1.bwd kind=bwd lane=gpu step=1 unit=1 deps=s1.L1.w.h2d
op s1.L0.w.h2d kind=h2d_param lane=h2d step=1 unit=0
"""
    )
    costs = FixedCosts(seconds_by_id={"s1.L1.fwd": 3.0, "s1.L1.w.h2d": 2.0, "s1.L0.w.h2d": 1.0})
    assert _times(timeline(g, costs)) == {
        "s1.L1.fwd": (0.0, 3.0),
        "s1.L1.w.h2d": (3.0, 5.0),
        "s1.L1.bwd": (5.0, 6.0),
        "s1.L0.w.h2d": (5.0, 6.0),
    }
    assert _times(timeline(g, costs)) == _times(simulate(g, costs))
    with pytest.raises(ValueError, match=r"duration -1\.0 is not >= 0"):
        timeline(g, FixedCosts(default=-1.0))
