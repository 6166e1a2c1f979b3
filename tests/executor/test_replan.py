"""Online re-planning (slide_ir.planning.refit, slide.session.train's `replan_request`): after the first steady
steps a run re-fits its profile to its measured lanes, and moves to the placement the search
then chooses when it is predicted >= 3% faster; the training itself does not change."""

from __future__ import annotations

import pytest
from runs import STEPS, B, S, assert_bitwise_equal, assert_matches_reference, run_executor

from slide import session
from slide_ir import TrainConfig, load_machine
from slide_ir.planning import programs, refit

REQUEST = TrainConfig(batch=B, seq=S, steps=STEPS, placement="fast")


def _as_rate_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lane counts as rate-bound: the tiny model's host updates are mostly their call's
    fixed cost (`host_rates.ADAM_CALL_S`, 30 us against a few us of elements), so the re-fit
    would rightly leave the cpu rates alone; these tests are about the move itself."""
    monkeypatch.setattr(refit, "fixed_shares", lambda p, steps, rolled_back=(): {})


def test_a_slow_cpu_lane_moves_units_to_the_gpu(monkeypatch):
    """The cpu lane measured 8x slower than the profile: the search on the re-fit profile keeps
    more units resident; the run moves there after step 6 and still trains as the reference."""
    monkeypatch.setattr(refit, "lane_factors", lambda measured, predicted: {"cpu": 8.0})
    _as_rate_bound(monkeypatch)
    monkeypatch.setattr(session, "MOVE_COST_PER_SETUP", 0.0)  # a move here costs nothing
    result = run_executor(False, placement="fast", train_kwargs={"replan_request": REQUEST})
    replan = result.meta["replan"]
    assert replan["replanned"], replan
    assert replan["best_step_s"] <= (1 - refit.MIN_GAIN) * replan["running_step_s"]
    planned_from_start = run_executor(False, placement="fast")
    assert len(result.meta["resident"]) > len(planned_from_start.meta["resident"])
    # by default the trace is of the four steps after the check (7-10), run by the new plan
    assert {s.step for s in result.trace.spans} == {7, 8, 9, 10}
    assert result.trace.info != planned_from_start.trace.info
    assert result.trace.info.steps == STEPS
    assert_matches_reference(result, tied=False, config={})


def test_a_move_the_steps_left_cannot_pay_for_is_not_made(monkeypatch):
    """The same faster placement, but the move costs more than the 4 steps left would save
    (the tiny model's steps are predicted in microseconds): the run stays, bitwise as one never
    checked, and says why."""
    monkeypatch.setattr(refit, "lane_factors", lambda measured, predicted: {"cpu": 8.0})
    _as_rate_bound(monkeypatch)
    checked = run_executor(False, placement="fast", train_kwargs={"replan_request": REQUEST})
    replan = checked.meta["replan"]
    assert not replan["replanned"], replan
    assert "faster on the measured rates, but the 4 steps left would save" in replan["reason"]
    assert_bitwise_equal(checked, run_executor(False, placement="fast"))


def test_rates_as_predicted_keep_the_plan(monkeypatch):
    """Measured as predicted: the same placement, bitwise the same run as one never checked."""
    monkeypatch.setattr(refit, "lane_factors", lambda measured, predicted: {})
    checked = run_executor(False, placement="fast", train_kwargs={"replan_request": REQUEST})
    assert not checked.meta["replan"]["replanned"]
    assert_bitwise_equal(checked, run_executor(False, placement="fast"))


def test_lane_factors_are_measured_over_predicted_per_kind():
    measured = {"gpu": 2.0, "nvme0": 1.0, "nvme1": 3.0, "cpu": 50.0, "h2d": 1.0}
    predicted = {"gpu": 1.0, "nvme": 2.0, "cpu": 1.0}
    # cpu 50x off is a fault, not a rate; h2d has no prediction to compare with
    assert refit.lane_factors(measured, predicted) == {"gpu": 2.0, "nvme": 2.0}


def test_a_refit_machine_divides_each_lanes_rates():
    m = load_machine("h200-16c-128g")
    fitted = refit.refit_machine(m, {"cpu": 2.0, "h2d": 1.25})
    assert fitted.cpu.adam_elems_per_s_per_core == m.cpu.adam_elems_per_s_per_core / 2
    assert fitted.link.h2d_bytes_per_s == m.link.h2d_bytes_per_s / 1.25
    assert fitted.link.d2h_bytes_per_s == m.link.d2h_bytes_per_s
    assert fitted.gpu == m.gpu
    assert "re-fit" in fitted.source("cpu.adam_elems_per_s_per_core")


def test_a_kept_plan_runs_on_past_its_short_first_pass(monkeypatch):
    """No move after the 6-step first pass: the next passes repeat the whole graph again (a run
    longer than its graph once failed at step 7 by repeating the short pass's graph)."""
    monkeypatch.setattr(programs, "GRAPH_STEPS", 8)
    monkeypatch.setattr(refit, "lane_factors", lambda measured, predicted: {})
    steps = (
        session.REPLAN_AFTER + 2 * programs.GRAPH_STEPS + 1
    )  # the short pass, two whole, one short
    checked = run_executor(
        False, steps=steps, placement="fast", train_kwargs={"replan_request": REQUEST}
    )
    assert not checked.meta["replan"]["replanned"]
    assert_bitwise_equal(checked, run_executor(False, steps=steps, placement="fast"))


def test_the_summary_counts_the_steps_after_the_check_and_its_step():
    after = session.REPLAN_AFTER
    assert session.steady_from(after + 6, after) == after + 2  # the check's step is left out
    assert session.steady_from(after + 1, after) == 2  # no step after the check's: all but 1
    assert session.steady_from(5, None) == 2  # no re-planning: every step after the first


def test_a_lane_bound_by_its_floors_refits_the_floors_not_the_rates():
    """llama-3.2-1b at batch 1 x seq 128 on a profile with dispatch floors: its GPU lane is
    mostly floors, so a measurement of 1.4-3x the prediction (as the H200 gave) says nothing
    about the GPU's rates: each floor is re-fitted from the ops it bounds instead, and the
    re-fit profile predicts each op kind's measured time. At batch 16 x 1024 the same lane is
    rate-bound and its rates are re-fitted."""
    from dataclasses import replace

    from slide_ir.planning.cost import FLOOR_FIELDS
    from slide_ir.planning.planner import plan
    from slide_ir.specs.model_catalog import load_model

    m = load_machine("h200-16c-128g")
    m = replace(m, gpu=replace(m.gpu, layer_fwd_floor_s=1e-3, layer_bwd_floor_s=1.5e-3,
                                 loss_floor_s=1.5e-3))  # fmt: skip
    slower = {"fwd": 3.0, "recompute": 3.0, "bwd": 1.4, "loss": 1.4}  # as tiny-llama measured
    steps = {2, 3}
    for batch, seq, rate_bound in ((1, 128, False), (16, 1024, True)):
        config = TrainConfig(batch=batch, seq=seq, steps=8)
        running = plan(load_model("llama-3.2-1b"), m, config)
        assert (refit.fixed_shares(running, steps)["gpu"] < refit.MAX_FIXED_SHARE) == rate_bound
        by_kind = {kind: seconds * slower.get(kind, 1.0)
                   for kind, seconds in refit.predicted_busy(running, steps)[1].items()}  # fmt: skip
        measured = refit.predicted_busy(running, steps)[0]
        measured["gpu"] = sum(by_kind[k] for k in ("fwd", "bwd", "loss", "gpu_adam", "recompute")
                              if k in by_kind)  # fmt: skip
        factors = refit.replan(running, config, measured, steps, by_kind).factors
        assert ("gpu" in factors) == rate_bound, factors
        assert all((f in factors) != rate_bound for f in FLOOR_FIELDS), factors
        refitted = replace(running, machine=refit.refit_machine(m, factors))
        if rate_bound:  # one factor on the lane's rates: its total as measured
            again = refit.predicted_busy(refitted, steps)[0]["gpu"]
            assert again == pytest.approx(measured["gpu"], rel=0.02), factors
        else:  # one per floor: each op kind's time as measured
            again_by_kind = refit.predicted_busy(refitted, steps)[1]
            for kind in ("fwd", "bwd", "loss"):
                assert again_by_kind[kind] == pytest.approx(by_kind[kind], rel=0.02), kind
    doubled = refit.refit_machine(m, {"layer_bwd_floor_s": 2.0})
    assert doubled.gpu.layer_bwd_floor_s == 3e-3 and doubled.gpu.layer_fwd_floor_s == 1e-3
    assert doubled.gpu.bf16_matmul_tflops == m.gpu.bf16_matmul_tflops
    assert "measured ops it bounds: x 2.0000" in doubled.source("gpu.layer_bwd_floor_s")


def test_the_session_writes_the_refit_into_the_host_profile(monkeypatch):
    """`refit_profile`: the check's factors go to the cached profile once, after the run."""
    monkeypatch.setattr(refit, "lane_factors", lambda measured, predicted: {"cpu": 1.5})
    _as_rate_bound(monkeypatch)
    written = []
    monkeypatch.setattr(
        session, "refit_cache", lambda device, factors, shape: written.append(factors)
    )
    kwargs = {"replan_request": REQUEST, "refit_profile": True}
    result = run_executor(False, placement="fast", train_kwargs=kwargs)
    assert written == [result.meta["replan"]["factors"]] and written[0]["cpu"] == 1.5
    run_executor(False, placement="fast", train_kwargs={"replan_request": REQUEST})
    assert len(written) == 1  # without it, the profile is left alone


def test_a_lane_busy_for_little_of_the_step_is_not_refit():
    """A placement whose host updates take a few percent of its step measures little about
    the host's rates: its CPU lane at 0.4x the prediction re-fits nothing (that profile is
    kept for the shape's next plans, which may slide every layer). The same reading where
    the CPU lane carries the step re-fits it."""
    from slide_ir.planning.planner import plan
    from slide_ir.specs.model_catalog import load_model

    m, model, steps = load_machine("h200-16c-128g"), load_model("llama-3.2-3b"), {2, 3}
    for placement, extra, refits in (("fast", {"resident": 27}, False), ("small", {}, True)):
        config = TrainConfig(batch=16, seq=1024, steps=6, placement=placement, **extra)
        running = plan(model, m, config)
        measured, by_kind = refit.predicted_busy(running, steps)
        measured["cpu"] *= 0.4
        wall_s = len(steps) * refit.predict_step_s(running.graph, refit.step_costs(running)[0])
        share = refit.predicted_busy(running, steps)[0]["cpu"] / wall_s
        assert (share >= refit.MIN_BUSY_SHARE) == refits, share
        factors = refit.fitted_factors(running, measured, steps, by_kind)
        assert ("cpu" in factors) == refits, factors
