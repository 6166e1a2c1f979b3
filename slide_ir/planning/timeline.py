"""The predicted timeline of a Graph in plain Python: what the simulator computes, without simpy.

An op starts when it heads its lane and its dependencies are done, and both engines obey only
that rule (slot reuse is a dependency too). With every dependency earlier in the op list and
each lane in list order, one pass over the ops in list order gives every op's start and end:
start = max(end of the lane's previous op, ends of its dependencies). That is exactly the
simulator's schedule (`simulator.engine`; a test checks the spans are equal) at a fraction of
its cost, so the planner can rank placements with it and stay standard-library only.

Host AdamW shares DRAM with the copy engines: `shared_dram` prices each update by the DMA
traffic it meets, iterating to a fixed point. The simulator runs the same loop around its engine
(`simulator.dram`), so both predict the same step time.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from slide_ir.ir.graph import Graph, Op, OpKind
from slide_ir.ir.trace import Span, Trace
from slide_ir.planning.cost import CostModel

LINK_LANES = ("h2d", "d2h")
TOLERANCE = 0.02  # the fixed point stops when no update's DMA load moves by more than this
MAX_PASSES = 6
Times = Mapping[str, tuple[float, float]]  # op id -> (start, end)
R = TypeVar("R")


class Costs(Protocol):
    """Anything that prices an op in seconds (`slide_ir.planning.cost.CostModel`, `FixedCosts`)."""

    def seconds(self, op: Op) -> float: ...


class _Program:
    """A graph as index lists, so each pass of the fixed point is one tight loop."""

    def __init__(self, graph: Graph) -> None:
        self.ops = graph.ops
        position = {op.id: i for i, op in enumerate(graph.ops)}
        lanes = {lane: k for k, lane in enumerate(graph.lanes())}
        self.deps = [[position[d] for d in op.deps] for op in graph.ops]
        self.lane = [lanes[op.lane] for op in graph.ops]
        self.lanes = len(lanes)

    def run(self, durations: list[float]) -> tuple[list[float], list[float]]:
        """Starts and ends of every op, in list order."""
        lane_end = [0.0] * self.lanes
        starts: list[float] = []
        ends: list[float] = []
        for lane, deps, duration in zip(self.lane, self.deps, durations, strict=True):
            start = lane_end[lane]
            for d in deps:
                if ends[d] > start:
                    start = ends[d]
            starts.append(start)
            ends.append(start + duration)
            lane_end[lane] = start + duration
        return starts, ends

    def times(self, durations: list[float]) -> dict[str, tuple[float, float]]:
        starts, ends = self.run(durations)
        return {op.id: (s, e) for op, s, e in zip(self.ops, starts, ends, strict=True)}


def _durations(ops: Sequence[Op], costs: Costs) -> list[float]:
    out = [float(costs.seconds(op)) for op in ops]
    for op, d in zip(ops, out, strict=True):
        if not d >= 0:
            raise ValueError(f"op {op.id}: duration {d} is not >= 0")
    return out


def timeline(graph: Graph, costs: Costs) -> Trace:
    """Every op's span, by one pass in list order (no memory samples: the ledger has them)."""
    times = _Program(graph).times(_durations(graph.ops, costs))
    return _trace(graph, times)


def predict(graph: Graph, costs: CostModel) -> Trace:
    """The simulator's prediction of `graph` (host updates priced by the DMA load they meet)."""
    return _trace(graph, _predicted_times(graph, costs))


def predict_step_s(graph: Graph, costs: CostModel) -> float:
    """`step_time_s(predict(graph, costs))`, without building spans."""
    times = _predicted_times(graph, costs)
    ends: dict[int, float] = {}
    for op in graph.ops:
        ends[op.step] = max(ends.get(op.step, 0.0), times[op.id][1])
    return _steady_period(ends, min(s for s, _ in times.values()))


def step_time_s(trace: Trace) -> float:
    """Mean period between the ends of consecutive steady steps (>= 2), as `trace_metrics`
    defines it; the first step's length when there is only one."""
    ends: dict[int, float] = {}
    for s in trace.spans:
        ends[s.step] = max(ends.get(s.step, s.end), s.end)
    return _steady_period(ends, min(s.start for s in trace.spans))


def _steady_period(ends: Mapping[int, float], t0: float) -> float:
    steps = sorted(ends)
    steady = [s for s in steps if s >= 2] or steps[:1]
    lo = ends.get(steady[0] - 1, t0)
    return (ends[steady[-1]] - lo) / len(steady)


def _predicted_times(graph: Graph, costs: CostModel) -> Times:
    program = _Program(graph)
    base = _durations(graph.ops, costs)
    update_at = [i for i, op in enumerate(graph.ops) if op.kind == OpKind.ADAM]

    def run(loads: Mapping[str, float]) -> Times:
        durations = list(base)
        for i in update_at:
            op = graph.ops[i]
            durations[i] = float(costs.seconds_under_dma(op, loads.get(op.id, 1.0)))
        return program.times(durations)

    return shared_dram(graph, costs, run, lambda times: times)


def _trace(graph: Graph, times: Times) -> Trace:
    spans = tuple(Span.of(op, *times[op.id]) for op in graph.ops)
    return Trace(spans=spans, memory=(), info=graph.info, meta={"engine": "timeline"})


# -- host updates under DMA traffic ------------------------------------------------------------
class LoadedCosts:
    """`costs`, with each host AdamW priced at the DMA load given for it (1.0: full duplex)."""

    def __init__(self, costs: CostModel, loads: Mapping[str, float]) -> None:
        self.costs, self.loads = costs, loads

    def seconds(self, op: Op) -> float:
        return self.costs.seconds_under_dma(op, self.loads.get(op.id, 1.0))


def shared_dram(
    graph: Graph,
    costs: CostModel,
    run: Callable[[Mapping[str, float]], R],
    times: Callable[[R], Times],
) -> R:
    """`run(loads)` (an engine on `graph`, each host AdamW priced at its DMA load) to a fixed
    point: every load 1.0 (full duplex) first; then measure over each update's span the mean
    busy share of the `h2d` and `d2h` lanes, re-price at that load and run again, until no
    load moves by more than TOLERANCE. Each new load is averaged with the last, which keeps the
    iteration from swinging. No loaded DRAM figure for the machine: one run."""
    updates = [op.id for op in graph.ops if op.kind == OpKind.ADAM]
    if getattr(costs.machine.cpu, "dram_under_dma_bytes_per_s", None) is None:
        updates = []  # every load prices the same
    link = {lane: [op.id for op in graph.lane_ops(lane)] for lane in LINK_LANES}
    loads = dict.fromkeys(updates, 1.0)
    result = run(loads)
    for _ in range(MAX_PASSES if updates else 0):
        t = times(result)
        busy = [_Busy([t[i] for i in ids]) for ids in link.values()]
        met = {i: _load(busy, *t[i]) for i in updates}
        if max(abs(met[i] - loads[i]) for i in updates) <= TOLERANCE:
            break
        loads = {i: (loads[i] + met[i]) / 2 for i in updates}
        result = run(loads)
    return result


class _Busy:
    """Busy time of one lane up to any instant (its spans never overlap)."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        spans.sort()
        self.starts = [s for s, _ in spans]
        self.ends = [e for _, e in spans]
        self.before = [0.0]  # busy time of the spans before index i
        for s, e in spans:
            self.before.append(self.before[-1] + e - s)

    def until(self, t: float) -> float:
        i = bisect_right(self.starts, t)  # spans starting at or before t
        if i == 0:
            return 0.0
        return self.before[i - 1] + min(t, self.ends[i - 1]) - self.starts[i - 1]


def _load(lanes: list[_Busy], start: float, end: float) -> float:
    """The mean busy share of `lanes` over [start, end], 0 to 1 (1 for an empty span)."""
    if end <= start:
        return 1.0
    busy = sum(b.until(end) - b.until(start) for b in lanes)
    # clamped: differences of float prefix sums can stray an ulp outside [0, 1]
    return min(1.0, max(0.0, busy / (len(lanes) * (end - start))))


def dma_loads(trace: Trace, op_ids: list[str]) -> dict[str, float]:
    """Per op: the mean busy share of the link lanes over its span, 0 to 1."""
    lanes = [_Busy([(s.start, s.end) for s in trace.spans if s.lane == ln]) for ln in LINK_LANES]
    span = {s.op_id: s for s in trace.spans}
    return {i: _load(lanes, span[i].start, span[i].end) for i in op_ids}
