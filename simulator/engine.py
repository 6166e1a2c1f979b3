"""The discrete-event engine: run a Graph in simpy and return its predicted Trace.

One simpy process per lane walks the lane's ops in graph order. An op starts when

1. it heads its lane (the process finished the previous op),
2. every dependency's completion event has fired, and
3. every slot it acquires is free: each slot is a `simpy.Resource` of capacity 1, so a tenant
   that has not released its slot really blocks the next one (a full GPU cache-unit ring stalls
   the prefetch). The planner writes every reuse as a dependency as well, so on a valid graph
   the request is granted at once; the resource is the engine enforcing it, not trusting it.

It then holds for `costs.seconds(op)`, releases its slots and fires its completion event.
Memory per tier is static pools + held slots; a sample is written whenever a tier's bytes change,
keeping one value per instant (a release and an acquire at the same time do not overlap: a slot
is held over [start of acquirer, end of releaser)).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Mapping
from typing import Any, Protocol

import simpy

from slide_ir.ir.graph import Graph, Op
from slide_ir.ir.trace import MemorySample, Span, Trace

log = logging.getLogger(__name__)


class Costs(Protocol):
    """Anything that prices an op in seconds (`slide_ir.planning.cost.CostModel`, `FixedCosts`)."""

    def seconds(self, op: Op) -> float: ...


class _Memory:
    """Bytes per tier over time, from slot occupancy."""

    def __init__(self, graph: Graph) -> None:
        self.slot = {
            s: (str(p.tier), p.slot_bytes)
            for p in graph.pools
            if not p.static
            for s in p.slot_ids()
        }
        self.now: dict[str, int] = {str(p.tier): 0 for p in graph.pools}
        for tier, b in graph.static_bytes().items():
            if str(tier) in self.now:
                self.now[str(tier)] += b
        self.samples: dict[str, list[list[float]]] = {t: [[0.0, b]] for t, b in self.now.items()}

    def change(self, time: float, slot: str, sign: int) -> None:
        tier, size = self.slot[slot]
        self.now[tier] += sign * size
        series = self.samples[tier]
        if series[-1][0] == time:
            series[-1][1] = self.now[tier]
        else:
            series.append([time, self.now[tier]])

    def to_samples(self) -> tuple[MemorySample, ...]:
        out = [
            MemorySample(time=t, tier=tier, bytes=int(b))
            for tier, series in self.samples.items()
            for t, b in _dedupe(series)
        ]
        return tuple(sorted(out, key=lambda m: m.time))


def _dedupe(series: list[list[float]]) -> Iterator[tuple[float, float]]:
    """Drop samples that repeat the previous value (same-instant acquire + release)."""
    last = None
    for t, b in series:
        if b != last:
            yield t, b
            last = b


class _Run:
    """Shared state of one simulation: completion events, slot resources, spans, memory."""

    def __init__(self, env: simpy.Environment, graph: Graph, durations: Mapping[str, float]):
        self.env = env
        self.durations = durations
        self.done = {op.id: env.event() for op in graph.ops}
        self.slots = {s: simpy.Resource(env, capacity=1) for s in graph.slot_bytes()}
        self.held: dict[str, simpy.resources.resource.Request] = {}
        self.memory = _Memory(graph)
        self.spans: list[Span] = []

    def lane(self, ops: tuple[Op, ...]) -> Generator[simpy.events.Event, Any, None]:
        env = self.env
        for op in ops:
            pending = [self.done[d] for d in op.deps if not self.done[d].processed]
            if pending:
                yield env.all_of(pending)
            for s in op.acquires:
                request = self.slots[s].request()
                yield request
                self.held[s] = request
                self.memory.change(env.now, s, +1)
            start = env.now
            yield env.timeout(self.durations[op.id])
            for s in op.releases:
                self.slots[s].release(self.held.pop(s))
                self.memory.change(env.now, s, -1)
            self.spans.append(Span.of(op, float(start), float(env.now)))
            self.done[op.id].succeed()


def simulate(graph: Graph, costs: Costs, *, meta: Mapping[str, object] | None = None) -> Trace:
    """Predicted trace of `graph` with op durations from `costs`."""
    durations = {op.id: float(costs.seconds(op)) for op in graph.ops}
    bad = [i for i, d in durations.items() if not d >= 0]
    if bad:
        raise ValueError(f"op {bad[0]}: duration {durations[bad[0]]} is not >= 0")
    env = simpy.Environment()
    run = _Run(env, graph, durations)
    for lane in graph.lanes():
        env.process(run.lane(graph.lane_ops(lane)))
    env.run()
    _check_finished(graph, run)
    spans = tuple(sorted(run.spans, key=lambda s: (s.start, s.end)))
    log.info("simulated %d ops on %d lanes: %.4g s", len(spans), len(graph.lanes()), env.now)
    return Trace(
        spans=spans,
        memory=run.memory.to_samples(),
        info=graph.info,
        meta={"engine": "simulator", **(meta or {})},
    )


def _check_finished(graph: Graph, run: _Run) -> None:
    """A valid graph cannot deadlock; if one did, name the op each stuck lane waits at."""
    stuck: dict[str, str] = {}
    for op in graph.ops:
        if not run.done[op.id].processed and op.lane not in stuck:
            stuck[op.lane] = op.id
    if stuck:
        waits = ", ".join(f"{lane} at {op_id}" for lane, op_id in stuck.items())
        raise RuntimeError(f"simulation deadlocked: {waits}")
