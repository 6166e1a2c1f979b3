"""Host updates share DRAM with the copy engines: price each AdamW by the DMA traffic it met.

`CostModel.seconds` prices a host AdamW at the DRAM bandwidth left while both copy engines stream
at full duplex, the calibrated worst case. How much traffic an update really meets depends on the
schedule: pure sliding at small batch leaves the link mostly idle while the CPU works through
the backward's tail and the next forward; streamed updates keep it busy. So the simulation runs
to a fixed point: simulate, measure over each update's span the mean busy share of the `h2d` and
`d2h` lanes (a busy lane moves data at the duplex rate), re-price the update at that load
(`CostModel.seconds_under_dma`), and simulate again until no update's load moves by more than
TOLERANCE. Each new load is averaged with the last, which keeps the iteration from swinging.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping

from simulator.engine import simulate
from slide_ir.cost import CostModel
from slide_ir.graph import Graph, Op, OpKind
from slide_ir.trace import Span, Trace

LINK_LANES = ("h2d", "d2h")
TOLERANCE = 0.02
MAX_PASSES = 6


class _LoadedCosts:
    def __init__(self, costs: CostModel, loads: Mapping[str, float]) -> None:
        self.costs, self.loads = costs, loads

    def seconds(self, op: Op) -> float:
        return self.costs.seconds_under_dma(op, self.loads.get(op.id, 1.0))


def simulate_shared_dram(
    graph: Graph, costs: CostModel, *, meta: Mapping[str, object] | None = None
) -> Trace:
    """`simulate`, with every host AdamW priced at the DMA load it runs beside."""
    updates = [op.id for op in graph.ops if op.kind == OpKind.ADAM]
    if getattr(costs.machine.cpu, "dram_under_dma_bytes_per_s", None) is None:
        updates = []  # no loaded figure: every load prices the same
    loads = dict.fromkeys(updates, 1.0)
    trace = simulate(graph, _LoadedCosts(costs, loads), meta=meta)
    for _ in range(MAX_PASSES if updates else 0):
        met = dma_loads(trace, updates)
        if max(abs(met[i] - loads[i]) for i in updates) <= TOLERANCE:
            break
        loads = {i: (loads[i] + met[i]) / 2 for i in updates}
        trace = simulate(graph, _LoadedCosts(costs, loads), meta=meta)
    return trace


class _Busy:
    """Busy time of one lane up to any instant (its spans never overlap)."""

    def __init__(self, spans: list[Span]) -> None:
        spans.sort(key=lambda s: s.start)
        self.starts = [s.start for s in spans]
        self.ends = [s.end for s in spans]
        self.before = [0.0]  # busy time of the spans before index i
        for s in spans:
            self.before.append(self.before[-1] + s.end - s.start)

    def until(self, t: float) -> float:
        i = bisect_right(self.starts, t)  # spans starting at or before t
        if i == 0:
            return 0.0
        return self.before[i - 1] + min(t, self.ends[i - 1]) - self.starts[i - 1]


def dma_loads(trace: Trace, op_ids: list[str]) -> dict[str, float]:
    """Per op: the mean busy share of the link lanes over its span, 0 to 1."""
    lanes = [_Busy([s for s in trace.spans if s.lane == lane]) for lane in LINK_LANES]
    span = {s.op_id: s for s in trace.spans}
    out = {}
    for op_id in op_ids:
        s = span[op_id]
        if s.end <= s.start:
            out[op_id] = 1.0
            continue
        busy = sum(b.until(s.end) - b.until(s.start) for b in lanes)
        # clamped: differences of float prefix sums can stray an ulp outside [0, 1]
        out[op_id] = min(1.0, max(0.0, busy / (len(lanes) * (s.end - s.start))))
    return out
