"""Host updates share DRAM with the copy engines: price each AdamW by the DMA traffic it met.

`CostModel.seconds` prices a host AdamW at the DRAM bandwidth left while both copy engines stream
at full duplex, the calibrated worst case. How much traffic an update really meets depends on the
schedule: pure sliding at small batch leaves the link mostly idle while the CPU works through
the backward's tail and the next forward; streamed updates keep it busy. So the simulation runs
to a fixed point: simulate, measure over each update's span the mean busy share of the `h2d` and
`d2h` lanes (a busy lane moves data at the duplex rate), re-price the update at that load
(`CostModel.seconds_under_dma`), and simulate again until no update's load moves by more than
TOLERANCE. The loop is `slide_ir.planning.timeline.shared_dram`, which the planner runs around its own
timeline: planner and simulator predict the same step.
"""

from __future__ import annotations

from collections.abc import Mapping

from simulator.engine import simulate
from slide_ir.ir.graph import Graph
from slide_ir.ir.trace import Trace
from slide_ir.planning.cost import CostModel
from slide_ir.planning.timeline import (
    MAX_PASSES,
    TOLERANCE,
    LoadedCosts,
    Times,
    dma_loads,
    shared_dram,
)

__all__ = ["MAX_PASSES", "TOLERANCE", "dma_loads", "simulate_shared_dram"]


def simulate_shared_dram(
    graph: Graph, costs: CostModel, *, meta: Mapping[str, object] | None = None
) -> Trace:
    """`simulate`, with every host AdamW priced at the DMA load it runs beside."""

    def run(loads: Mapping[str, float]) -> Trace:
        return simulate(graph, LoadedCosts(costs, loads), meta=meta)

    return shared_dram(graph, costs, run, span_times)


def span_times(trace: Trace) -> Times:
    return {s.op_id: (s.start, s.end) for s in trace.spans}
