"""Analyses: the batch search against brute force, and the sweeps' shapes."""

import pytest

from simulator.analyses import _smallest, critical_batch, schedule_sweep
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine


@pytest.mark.parametrize("limit", [1, 7, 64])
@pytest.mark.parametrize("fit_up_to", [0, 1, 5, 30, 100])
@pytest.mark.parametrize("ok_from", [1, 3, 6, 40, 100])
def test_batch_search_matches_brute_force(limit, fit_up_to, ok_from):
    calls = []

    def row(b):
        calls.append(b)
        return {"feasible": b <= fit_up_to, "b": b}

    found = _smallest(row, lambda r: r["feasible"], lambda r: r["b"] >= ok_from, limit)
    brute = next((b for b in range(1, limit + 1) if b <= fit_up_to and b >= ok_from), None)
    assert found == brute
    assert len(set(calls)) <= 2 * limit.bit_length() + 2  # logarithmic, not a scan


def test_critical_batch_is_the_eta_crossover():
    machine = load_machine("paper-pc-4090")
    found = critical_batch("llama-3.2-1b", machine, TrainConfig(batch=1, seq=512, steps=2))
    cb = found.critical_batch
    assert cb is not None and cb <= found.max_feasible_batch
    assert found.points[cb]["eta"] >= 1.0
    below = [b for b in found.points if b < cb]
    assert all(found.points[b]["eta"] < 1.0 for b in below)
    util = found.critical_batch_util97
    assert util is not None and found.points[util]["gpu_bwd_util"] >= 0.97


def test_schedules_side_by_side():
    rows = schedule_sweep("llama-3.2-1b", "paper-pc-4090", TrainConfig(batch=4, seq=512, steps=2))
    assert [r["schedule"] for r in rows] == ["sliding", "zero-offload", "gpu-only"]
    by = {r["schedule"]: r for r in rows}
    assert all(r["feasible"] for r in rows)
    # overlap: sliding is faster than the serialised zero-offload step at the same point
    assert by["sliding"]["step_time_s"] < by["zero-offload"]["step_time_s"]
    assert by["gpu-only"]["eta"] is None  # nothing offloaded
