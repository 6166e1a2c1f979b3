"""Simulated data-parallel sliding (`simulator.data_parallel`): one rank's timeline for N."""

from __future__ import annotations

import pytest

from simulator.data_parallel import simulate_data_parallel
from simulator.run import simulate_plan
from slide_ir.ir.trace import trace_violations
from slide_ir.specs.config import TrainConfig


def test_one_rank_predicts_the_single_gpu_run():
    config = TrainConfig(batch=4, seq=64, steps=3)
    dp = simulate_data_parallel("tiny-llama", "h200-16c-128g", config, 1)
    single = simulate_plan("tiny-llama", "h200-16c-128g", config)
    assert dp.rank.trace == single.trace
    s, d = dp.summary(), single.summary()
    assert s["step_time_s"] == d["step_time_s"] and s["tokens_per_s"] == d["tokens_per_s"]
    assert s["ledger"] == d["ledger"]


@pytest.fixture(scope="module")
def llama8b():
    # no kept tapes: the search fills the GPU to its margin with them whatever N is, and the
    # per-rank GPU memory is compared below
    config = TrainConfig(batch=32, seq=1024, steps=3, keep_activations=0)
    return {n: simulate_data_parallel("llama-3.1-8b", "h200-16c-128g", config, n) for n in (1, 2)}


def test_two_h200s_beat_one_and_the_net_lane_works(llama8b):
    one, two = llama8b[1].summary(), llama8b[2].summary()
    assert two["feasible"] and one["feasible"]
    assert two["step_time_s"] < one["step_time_s"]
    assert two["tokens_per_s"] > one["tokens_per_s"]
    assert two["batch"] == one["batch"] == 32  # the global batch
    assert two["data_parallel"]["rank_batch"] == 16
    assert two["lane_util"]["net"] > 0.0 and "net" not in one["lane_util"]
    assert two["data_parallel"]["net_bytes_per_step"] > 0
    assert two["ledger"]["gpu"] < one["ledger"]["gpu"]  # per rank
    assert two["ledger"]["cpu"] <= one["ledger"]["cpu"] + 2 * 2**30  # per host


def test_the_trace_checks_against_its_graph(llama8b):
    result = llama8b[2]
    assert trace_violations(result.trace, result.dp.graph, tolerance_s=1e-9) == []
