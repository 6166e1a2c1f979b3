"""The engine on hand-written schedules: exact timelines, blocking on slots, memory from slots,
and properties against networkx (makespan vs critical path, busiest lane, total work)."""

import random

import networkx as nx
import pytest

from simulator.engine import simulate
from slide_ir.ir.graph import Graph, GraphInfo, Op, OpKind, Pool, Tier
from slide_ir.ir.printing import parse_graph
from slide_ir.planning.cost import FixedCosts

HEADER = (
    "info schedule=sliding model=tiny machine=m batch=1 seq=8 steps={steps} grad_accum=1 "
    "num_layers={layers} params=100 flops_per_step=1e9\n"
)

# Three layers through a ring of two GPU cache units: the third upload waits for layer 1's
# forward to free unit 0 (the ring is full), so h2d idles from 4 to 5.
RING = (
    HEADER.format(steps=1, layers=3)
    + """
pool units tier=gpu slots=2 slot_bytes=100 static=0
pool master tier=cpu slots=1 slot_bytes=400 static=1
op L1.h2d kind=h2d_param lane=h2d step=1 unit=1 acquires=units.0
op L2.h2d kind=h2d_param lane=h2d step=1 unit=2 acquires=units.1
op L1.fwd kind=fwd lane=gpu step=1 unit=1 deps=L1.h2d releases=units.0
op L3.h2d kind=h2d_param lane=h2d step=1 unit=3 deps=L1.fwd acquires=units.0
op L2.fwd kind=fwd lane=gpu step=1 unit=2 deps=L2.h2d releases=units.1
op L3.fwd kind=fwd lane=gpu step=1 unit=3 deps=L3.h2d releases=units.0
"""
)


def _by_lane(graph, **seconds):
    return FixedCosts(seconds_by_id={op.id: seconds[op.lane] for op in graph.ops})


def test_ring_timeline_is_exact():
    graph = parse_graph(RING)
    trace = simulate(graph, _by_lane(graph, h2d=2.0, gpu=3.0))
    got = {s.op_id: (s.start, s.end) for s in trace.spans}
    assert got == {
        "L1.h2d": (0, 2),
        "L2.h2d": (2, 4),
        "L1.fwd": (2, 5),
        "L3.h2d": (5, 7),  # blocked by the full ring until L1.fwd releases units.0
        "L2.fwd": (5, 8),
        "L3.fwd": (8, 11),
    }


def test_memory_follows_slot_occupancy():
    graph = parse_graph(RING)
    trace = simulate(graph, _by_lane(graph, h2d=2.0, gpu=3.0))
    gpu = [(m.time, m.bytes) for m in trace.memory if m.tier == "gpu"]
    # units.0 re-acquired at 5 just as it is released: no double count at that instant
    assert gpu == [(0, 100), (2, 200), (8, 100), (11, 0)]
    assert [(m.time, m.bytes) for m in trace.memory if m.tier == "cpu"] == [(0, 400)]
    assert max(b for _, b in gpu) == graph.tier_bytes()[Tier.GPU]


# Backward of two layers with the CPU update overlapped: d2h and adam of layer 2 run while the
# GPU computes layer 1's backward; the pinned landing buffer (one slot) serialises the downloads.
OVERLAP = (
    HEADER.format(steps=1, layers=2)
    + """
pool grads tier=pinned slots=1 slot_bytes=50 static=0
op L2.bwd kind=bwd lane=gpu step=1 unit=2
op L2.g.d2h kind=d2h_grad lane=d2h step=1 unit=2 deps=L2.bwd acquires=grads.0
op L1.bwd kind=bwd lane=gpu step=1 unit=1
op L2.adam kind=adam lane=cpu step=1 unit=2 deps=L2.g.d2h releases=grads.0
op L1.g.d2h kind=d2h_grad lane=d2h step=1 unit=1 deps=L1.bwd,L2.adam acquires=grads.0
op L1.adam kind=adam lane=cpu step=1 unit=1 deps=L1.g.d2h releases=grads.0
"""
)


def test_overlapped_backward_timeline_is_exact():
    graph = parse_graph(OVERLAP)
    trace = simulate(graph, _by_lane(graph, gpu=4.0, d2h=1.0, cpu=2.0))
    got = {s.op_id: (s.start, s.end) for s in trace.spans}
    assert got == {
        "L2.bwd": (0, 4),
        "L2.g.d2h": (4, 5),
        "L1.bwd": (4, 8),
        "L2.adam": (5, 7),
        "L1.g.d2h": (8, 9),
        "L1.adam": (9, 11),
    }
    pinned = [(m.time, m.bytes) for m in trace.memory if m.tier == "pinned"]
    assert pinned == [(0, 0), (4, 50), (7, 0), (8, 50), (11, 0)]


def test_zero_duration_ops_and_empty_lanes():
    graph = parse_graph(RING)
    trace = simulate(graph, FixedCosts(default=0.0))
    assert all(s.start == s.end == 0 for s in trace.spans)


def test_negative_duration_is_refused():
    graph = parse_graph(RING)
    with pytest.raises(ValueError, match=r"op L1\.h2d: duration -1\.0"):
        simulate(graph, FixedCosts(seconds_by_id={"L1.h2d": -1.0}))


def _random_graph(seed: int, n: int = 60) -> Graph:
    """A random valid schedule: random lanes and earlier deps, plus a GPU ring of two slots
    used as the planner does (each tenant's uploader depends on the previous tenant's user)."""
    rng = random.Random(seed)
    lanes = ["gpu", "h2d", "d2h", "cpu", "nvme0"]
    ops: list[Op] = []
    ring_users: list[str] = []
    for i in range(n):
        deps = tuple(rng.sample([o.id for o in ops], k=min(len(ops), rng.randint(0, 2))))
        if i % 6 == 0:  # upload into the ring, then a compute op that frees it
            slot = f"units.{len(ring_users) % 2}"
            if len(ring_users) >= 2:
                deps = (*deps, ring_users[-2])
            up = Op(
                id=f"up{i}",
                kind=OpKind.H2D_PARAM,
                lane="h2d",
                step=1,
                unit=1,
                deps=tuple(dict.fromkeys(deps)),
                acquires=(slot,),
            )
            use = Op(
                id=f"use{i}",
                kind=OpKind.FWD,
                lane="gpu",
                step=1,
                unit=1,
                deps=(up.id,),
                releases=(slot,),
            )
            ops += [up, use]
            ring_users.append(use.id)
            continue
        ops.append(
            Op(
                id=f"op{i}",
                kind=OpKind.FWD,
                lane=rng.choice(lanes),
                step=1,
                unit=1,
                deps=tuple(dict.fromkeys(deps)),
            )
        )
    info = GraphInfo(
        schedule="sliding",
        model="rand",
        machine="m",
        batch=1,
        seq=1,
        steps=1,
        num_layers=1,
        params=1,
        flops_per_step=1.0,
    )
    pools = (Pool(name="units", tier=Tier.GPU, slots=2, slot_bytes=10),)
    return Graph(info=info, pools=pools, ops=tuple(ops))


@pytest.mark.parametrize("seed", range(8))
def test_makespan_against_networkx(seed):
    graph = _random_graph(seed)
    rng = random.Random(1000 + seed)
    seconds = {op.id: rng.uniform(0.1, 3.0) for op in graph.ops}
    trace = simulate(graph, FixedCosts(seconds_by_id=seconds))
    makespan = max(s.end for s in trace.spans)
    dag = graph.to_networkx()
    for u, v in dag.edges:
        dag.edges[u, v]["w"] = seconds[u]
    path = nx.dag_longest_path(dag, weight="w")
    critical = sum(seconds[o] for o in path)
    busiest = max(sum(seconds[o.id] for o in graph.lane_ops(lane)) for lane in graph.lanes())
    assert makespan >= critical - 1e-9
    assert makespan >= busiest - 1e-9
    assert makespan <= sum(seconds.values()) + 1e-9
    # slot reuse is written as a dependency, so nothing else delays an op: exactly the path
    assert makespan == pytest.approx(critical)
    spans = {s.op_id: s for s in trace.spans}
    for op in graph.ops:  # every op starts when its last predecessor ends
        preds = list(dag.predecessors(op.id))
        expect = max((spans[p].end for p in preds), default=0.0)
        assert spans[op.id].start == pytest.approx(expect)


def test_critical_path_walks_back_through_the_gating_predecessor():
    from slide_ir.ir.trace import trace_metrics

    graph = parse_graph(RING)
    trace = simulate(graph, _by_lane(graph, h2d=2.0, gpu=3.0))
    m = trace_metrics(trace, graph)
    # L3.fwd waits for L2.fwd (ends 8; L3.h2d ended at 7), L2.fwd for L1.fwd (5 vs L2.h2d's 4),
    # L1.fwd for L1.h2d: gpu 3 + 3 + 3, h2d 2
    assert m.critical_path == {"gpu": 9.0, "h2d": 2.0}
    assert m.bottleneck == "gpu"


def test_traces_obey_their_graph_and_a_broken_one_is_named():
    from dataclasses import replace

    from slide_ir.ir.trace import trace_violations

    graph = parse_graph(RING)
    trace = simulate(graph, _by_lane(graph, h2d=2.0, gpu=3.0))
    assert trace_violations(trace, graph) == []
    spans = {s.op_id: s for s in trace.spans}
    early = replace(spans["L3.fwd"], start=spans["L3.h2d"].end - 0.5)  # before its upload ended
    broken = replace(trace, spans=tuple(early if s.op_id == "L3.fwd" else s for s in trace.spans))
    found = trace_violations(broken, graph)
    assert any("L3.fwd" in p and "dependency L3.h2d" in p for p in found)
    assert any("L3.fwd" in p and "on lane gpu" in p for p in found)  # overlaps L2.fwd too
    assert trace_violations(broken, graph, tolerance_s=2.0) == []
