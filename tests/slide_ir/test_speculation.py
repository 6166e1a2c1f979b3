"""Speculative updates under global clipping, on the planning side: the rollback slots in the
ledger, the REDO ops in the graph, their price in a kept and a rolled-back step, and the count
the planner chooses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slide_ir import OpKind, TrainConfig
from slide_ir.ir.graph import PoolRole
from slide_ir.planning.cost import CostModel
from slide_ir.planning.ledger import build_ledger
from slide_ir.planning.planner import plan
from slide_ir.planning.timeline import predict_step_s
from slide_ir.planning.units import FP32, unit_params

GLOBAL = TrainConfig(batch=16, seq=1024, clip="global", placement="small")


def test_rollback_slots_are_the_first_units_to_land(llama8b, pc):
    """k speculated units: the head and the top k - 1 layers, each 4 B master + 8 B moments."""
    k = 5
    led = build_ledger(llama8b, pc, replace(GLOBAL, activations="cpu", speculate=k))
    saved = [t.pool for t in led.terms if t.pool.role == PoolRole.ROLLBACK]
    units = sorted(u for p in saved for u in p.units)
    n = llama8b.num_layers
    assert units == [n - 3, n - 2, n - 1, n, n + 1]
    want = sum(unit_params(llama8b, u) for u in units) * (FP32 + 8)
    assert sum(p.slots * p.slot_bytes for p in saved) == want
    bf16 = build_ledger(llama8b, pc, replace(GLOBAL, activations="cpu", speculate=k,
                                             moments_dtype="bf16"))  # fmt: skip
    bf16_saved = sum(t.pool.slots * t.pool.slot_bytes for t in bf16.terms
                     if t.pool.role == PoolRole.ROLLBACK)  # fmt: skip
    assert bf16_saved == sum(unit_params(llama8b, u) for u in units) * (FP32 + 4)


def test_nothing_speculates_without_global_clipping_or_with_state_on_nvme(llama8b, pc):
    for config in (replace(GLOBAL, clip="none", speculate=5),
                   replace(GLOBAL, optimizer="nvme", speculate=5)):  # fmt: skip
        p = plan(llama8b, pc, config)
        assert not any(op.kind == OpKind.REDO for op in p.graph.ops)
        assert not any(t.pool.role == PoolRole.ROLLBACK for t in p.ledger.terms)


def test_redo_costs_nothing_kept_and_an_update_rolled_back(llama8b, pc):
    p = plan(llama8b, pc, replace(GLOBAL, speculate=3))
    redos = [op for op in p.graph.ops if op.kind == OpKind.REDO]
    assert len(redos) == 3 * p.config.steps
    costs = CostModel(pc)
    kept, rolled = costs.seconds(redos[0]), costs.rolling_back().seconds(redos[0])
    assert kept == costs.efficiency.launch_s
    speculated = {op.unit for op in redos}
    layer = [
        op for op in p.graph.ops if op.kind == OpKind.ADAM and 0 < op.unit <= p.model.num_layers
    ]
    deferred = next(op for op in layer if op.unit not in speculated)
    guess = next(op for op in layer if op.unit == redos[0].unit)
    # the guess wrote the saved state by streaming stores (never read first): 12 B/param more
    # than a plain update; the REDO, the saved state read back over the state and the update
    # again: 24 more
    assert rolled > costs.seconds(deferred)
    assert guess.work.bytes == deferred.work.bytes + (FP32 + 8) * guess.work.elements
    assert redos[0].work.bytes == deferred.work.bytes + 2 * (FP32 + 8) * guess.work.elements
    assert predict_step_s(p.graph, costs.rolling_back()) > predict_step_s(p.graph, costs)


@pytest.mark.parametrize("share", [0.0, 0.25, 1.0])
def test_the_chosen_count_has_the_least_expected_step(llama8b, pc, share):
    """Speculating pays on the 24 GB PC where the host bounds the step (unless every step rolls
    back), and the chosen plan's expected step beats deferring every update."""
    p = plan(llama8b, pc, replace(GLOBAL, rollback_share=share))
    s = p.speculation
    assert s is not None and p.config.speculate == s.units
    if share == 1.0:
        assert s.units == 0
        return
    assert s.units > 0
    assert s.expected_step_s < s.deferred_step_s
    assert plan(llama8b, pc, p.config).graph == p.graph  # the resolved count re-plans to itself


def test_a_plan_speculating_none_has_no_rollback_slots(llama8b, pc):
    """Every step rolling back: nothing speculates, and neither the ledger nor the graph holds
    what speculation would (the search that tried speculating every unit left none behind)."""
    p = plan(llama8b, pc, replace(GLOBAL, rollback_share=1.0))
    assert p.config.speculate == 0
    assert not any(t.pool.role == PoolRole.ROLLBACK for t in p.ledger.terms)
    assert not any(op.kind == OpKind.REDO for op in p.graph.ops)


def test_a_refit_prices_rolled_back_steps_as_rolled_back(llama8b, pc):
    """A run whose steps rolled back (clipped: every REDO redid its update) re-fits nothing
    when its lanes took what a rolled-back step is predicted to take; priced as kept steps, the
    CPU lane would read as slower than it is, and the profile kept for the next runs with it."""
    from slide_ir.planning import refit

    p = plan(llama8b, pc, replace(GLOBAL, speculate=6, steps=4))
    steps, rolled = {2, 3, 4}, frozenset({2, 3, 4})
    kept_busy, _ = refit.predicted_busy(p, steps)
    busy, by_kind = refit.predicted_busy(p, steps, rolled)
    assert busy["cpu"] > kept_busy["cpu"]
    assert all(
        abs(f - 1) < 1e-9 for f in refit.fitted_factors(p, busy, steps, by_kind, rolled).values()
    )
    assert refit.fitted_factors(p, busy, steps, by_kind)["cpu"] > 1.05
    half, _ = refit.predicted_busy(p, steps, frozenset({3}))
    assert kept_busy["cpu"] < half["cpu"] < busy["cpu"]
