"""Host updates priced by the DMA traffic they meet (simulator/dram.py)."""

import pytest

from simulator.dram import dma_loads, simulate_shared_dram
from simulator.engine import simulate
from slide_ir import TrainConfig, load_machine, load_model
from slide_ir.ir.graph import GraphInfo, OpKind
from slide_ir.ir.trace import Span, Trace
from slide_ir.planning.cost import CostModel
from slide_ir.planning.planner import plan

INFO = GraphInfo(schedule="sliding", model="m", machine="m", batch=1, seq=8, steps=1,
                 grad_accum=1, num_layers=1, params=1, flops_per_step=1.0)  # fmt: skip


def _span(op_id: str, lane: str, start: float, end: float) -> Span:
    kind = {"cpu": OpKind.ADAM, "h2d": OpKind.H2D_PARAM, "d2h": OpKind.D2H_GRAD}[lane]
    return Span(op_id=op_id, kind=str(kind), lane=lane, unit=1, step=1, start=start, end=end)


def test_load_is_the_mean_busy_share_of_both_link_lanes_over_the_span():
    spans = (
        _span("up1", "h2d", -2.0, 5.0),
        _span("up2", "h2d", 8.0, 9.0),
        _span("down", "d2h", 2.0, 4.0),
        _span("adam", "cpu", 0.0, 10.0),
        _span("later", "cpu", 20.0, 30.0),
    )
    loads = dma_loads(Trace(spans=spans, memory=(), info=INFO), ["adam", "later"])
    assert loads["adam"] == pytest.approx((5 + 1 + 2) / 20)
    assert loads["later"] == 0.0


@pytest.fixture(scope="module")
def pure_3b_b16():
    machine = load_machine("h200-16c-128g")
    p = plan(load_model("llama-3.2-3b"), machine, TrainConfig(batch=16, seq=1024, streamed=0))
    return p, CostModel(machine)


def test_updates_beside_a_quiet_link_run_faster_than_the_full_load_price(pure_3b_b16):
    p, costs = pure_3b_b16
    full = simulate(p.graph, costs)
    shared = simulate_shared_dram(p.graph, costs)
    adam = [op for op in p.graph.ops if op.kind == OpKind.ADAM and 1 <= op.unit <= 28]
    durations = {s.op_id: s.end - s.start for s in shared.spans}
    loads = dma_loads(shared, [op.id for op in adam])
    for op in adam:
        assert durations[op.id] < costs.seconds(op)
        # each update is priced at (about) the load it met in the final timeline
        repriced = costs.seconds_under_dma(op, loads[op.id])
        assert durations[op.id] == pytest.approx(repriced, rel=0.05)
    assert max(s.end for s in shared.spans) < max(s.end for s in full.spans)


def test_a_profile_without_a_loaded_figure_prices_updates_as_before():
    machine = load_machine("paper-pc-4090")
    assert machine.cpu.dram_under_dma_bytes_per_s is None
    p = plan(load_model("llama-3.2-1b"), machine, TrainConfig(batch=4, seq=512, steps=2))
    costs = CostModel(machine)
    assert simulate_shared_dram(p.graph, costs).spans == simulate(p.graph, costs).spans
