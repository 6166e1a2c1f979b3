"""The engine on real plans: memory agrees with the ledger, lanes never overlap, the timeline
obeys the start rule, and every placement (CPU, NVMe) and schedule simulates."""

import itertools
from collections import defaultdict

import pytest

from simulator.run import simulate_plan
from slide_ir.ir.graph import Tier
from slide_ir.planning.ledger import REPORT_TIERS
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine

CASES = {
    "sliding-cpu": ("qwen2.5-3b", "paper-pc-4090", {"placement": "small"}),
    "sliding-resident": ("qwen2.5-3b", "h200-16c-128g", {"resident": 8, "streamed": 0}),
    "searched": ("qwen2.5-3b", "h200-16c-128g", {}),
    "sliding-streamed": ("qwen2.5-3b", "h200-16c-128g", {"resident": 0, "streamed": "auto"}),
    "sliding-nvme": (
        "qwen2.5-3b",
        "paper-pc-4090",
        {"activations": "nvme", "optimizer": "nvme", "placement": "small"},
    ),
    "sliding-accum": ("llama-3.2-1b", "paper-pc-4090", {"grad_accum": 2}),
    "zero-offload": ("llama-3.2-1b", "paper-pc-4090", {"schedule": "zero-offload"}),
    "gpu-only": ("qwen2.5-0.5b", "paper-pc-4090", {"schedule": "gpu-only"}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def result(request):
    model, machine, extra = CASES[request.param]
    config = TrainConfig(batch=4, seq=512, steps=3, **extra)
    drives = 2 if extra.get("optimizer") == "nvme" else None
    r = simulate_plan(model, load_machine(machine, nvme=drives), config)
    assert r.feasible, r.plan.ledger.overflows()
    return r


def _pool_occupancy(result):
    """Max slots held at once per pool, and per tier whether every slot was ever held at once."""
    spans = {s.op_id: s for s in result.trace.spans}
    events = []
    for op in result.plan.graph.ops:
        events += [(spans[op.id].start, 1, s) for s in op.acquires]
        events += [(spans[op.id].end, -1, s) for s in op.releases]
    events.sort(key=lambda e: (e[0], e[1]))  # releases first at equal times: [start, end)
    held, peak = defaultdict(int), defaultdict(int)
    for _, sign, slot in events:
        pool = slot.rpartition(".")[0]
        held[pool] += sign
        peak[pool] = max(peak[pool], held[pool])
    return peak


def test_simulated_memory_within_ledger(result):
    simulated = result.summary()["memory"]
    ledger = result.plan.ledger
    for tier in REPORT_TIERS:
        assert simulated[tier] <= ledger.peak_bytes(tier), tier


def test_static_tiers_equal_the_ledger(result):
    """A tier holding only static pools (pageable host RAM, usually) is simulated exactly."""
    graph = result.plan.graph
    static_tiers = [t for t in Tier if all(p.static for p in graph.pools if p.tier == t)]
    for tier in static_tiers:
        reserved = graph.tier_bytes()[tier]
        assert result.metrics.peak_bytes.get(str(tier), 0) == reserved, tier


def test_rings_fill_and_never_overflow(result):
    """Every slotted pool stays within its slots, and the rings that gate progress fill up
    (the engine really ran them full rather than one tenant at a time)."""
    graph = result.plan.graph
    peak = _pool_occupancy(result)
    for pool in graph.pools:
        if not pool.static:
            assert peak[pool.name] <= pool.slots, pool.name
    gating = ["gpu_units", "pinned_acts"]
    ledger = result.plan.ledger
    if not (ledger.streamed or ledger.resident):  # else sized so that it never gates
        gating.append("pinned_grads_layers")
    for name in gating:
        if any(p.name == name for p in graph.pools):
            assert peak[name] == graph.pool(name).slots, name


def test_tier_peak_equals_ledger_when_every_pool_fills_at_once(result):
    """Where all of a tier's slots are held at one instant, its simulated peak is the ledger's."""
    graph = result.plan.graph
    peaks = result.metrics.peak_bytes
    for tier in Tier:
        pools = [p for p in graph.pools if p.tier == tier and not p.static]
        if pools and _all_held_at_once(result, {p.name for p in pools}):
            assert peaks[str(tier)] == graph.tier_bytes()[tier], tier


def _all_held_at_once(result, pools):
    graph = result.plan.graph
    spans = {s.op_id: s for s in result.trace.spans}
    need = sum(graph.pool(p).slots for p in pools)
    events = []
    for op in graph.ops:
        events += [(spans[op.id].start, 1) for s in op.acquires if s.rpartition(".")[0] in pools]
        events += [(spans[op.id].end, -1) for s in op.releases if s.rpartition(".")[0] in pools]
    held = 0
    for _, sign in sorted(events):
        held += sign
        if held == need:
            return True
    return False


def test_lanes_run_one_op_at_a_time_in_graph_order(result):
    by_lane = defaultdict(list)
    for s in result.trace.spans:
        by_lane[s.lane].append(s)
    order = {op.id: i for i, op in enumerate(result.plan.graph.ops)}
    for spans in by_lane.values():
        spans.sort(key=lambda s: order[s.op_id])
        for a, b in itertools.pairwise(spans):
            assert b.start >= a.end - 1e-12


def test_every_op_starts_when_its_last_dependency_ends(result):
    spans = {s.op_id: s for s in result.trace.spans}
    prev_on_lane = {}
    for op in result.plan.graph.ops:
        ends = [spans[d].end for d in op.deps]
        if op.lane in prev_on_lane:
            ends.append(spans[prev_on_lane[op.lane]].end)
        assert spans[op.id].start == pytest.approx(max(ends, default=0.0), abs=1e-12)
        prev_on_lane[op.lane] = op.id


def test_metrics_are_sane(result):
    s = result.summary()
    assert 0 < s["gpu_util"] <= 1 + 1e-9 and 0 <= s["gpu_bwd_util"] <= 1 + 1e-9
    assert s["tokens_per_s"] <= s["compute_only_tokens_per_s"] * (1 + 1e-9)
    assert s["bottleneck"] in s["lane_util"]
    assert s["first_step_s"] > 0 and s["step_time_s"] > 0
