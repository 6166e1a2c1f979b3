"""Co-located versus split pools, their search, and allgather CP beside zigzag in the layouts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.layout import simulate_layout
from slide_ir.layouts.cluster import load_cluster
from slide_ir.layouts.ledger import build_layout_ledger
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import Layout, cp_imbalance, cp_pair_counts, layout_problems
from slide_ir.layouts.pools import (
    SYNC_BUCKET,
    colocated,
    engines_for,
    search_pools,
    split,
    training_layout,
)
from slide_ir.layouts.rollout import Engine, RolloutWork, build_engine_ledger, engine_problems
from slide_ir.layouts.rollout_cost import rollout_time
from slide_ir.layouts.search import estimate
from slide_ir.layouts.work import stage_work
from slide_ir.planning.compute_terms import CUDA_CONTEXT_BYTES

NODE = load_cluster("h200-8gpu-node")
QWEN_MOE = load_layout_model("qwen3-30b-a3b")
WORK = RolloutWork(prompts=8, samples=8, prompt_len=2048, response_len=16384)
BASE = Layout(gpus=8, tp=2, cp=4, ep=8, cpu_adam=True, recompute=True,
              distributed_optimizer=True)  # fmt: skip


def test_training_layout_trains_the_rounds_sequences():
    lay = training_layout(BASE, WORK, 8)
    assert (lay.seq, lay.batch, lay.gpus) == (2048 + 16384, 64, 8)
    assert training_layout(BASE, WORK, 4).gpus == 4


def test_colocated_peak_is_the_larger_ledger_plus_the_resident_terms():
    lay, eng = training_layout(BASE, WORK, 8), Engine(gpus=8, tp=2, ep=8)
    plan = colocated(QWEN_MOE, lay, eng, WORK, NODE)
    train = build_layout_ledger(QWEN_MOE, lay, NODE)
    roll = build_engine_ledger(QWEN_MOE, eng, WORK, NODE, engines=1)
    assert dict(plan.resident) == {"train_context": CUDA_CONTEXT_BYTES,
                                   "rollout_context": CUDA_CONTEXT_BYTES,
                                   "sync_bucket": SYNC_BUCKET}  # fmt: skip
    sync = train.term("weights") + roll.term("weights") + 2 * CUDA_CONTEXT_BYTES + SYNC_BUCKET
    want = max(train.gpu_bytes + CUDA_CONTEXT_BYTES, roll.gpu_bytes + CUDA_CONTEXT_BYTES, sync)
    assert plan.peak_bytes == want
    assert plan.peak_bytes < train.gpu_bytes + roll.gpu_bytes  # sharing is the point
    assert plan.fits


def test_colocated_step_adds_the_switch_and_the_sync():
    lay, eng = training_layout(BASE, WORK, 8), Engine(gpus=8, tp=2, ep=8)
    plan = colocated(QWEN_MOE, lay, eng, WORK, NODE)
    train = build_layout_ledger(QWEN_MOE, lay, NODE)
    state = sum(train.term(k) for k in ("weights", "gradients", "master", "moments"))
    link = NODE.machine.link
    assert plan.switch_s == pytest.approx(
        state / link.d2h_bytes_per_s + state / link.h2d_bytes_per_s
    )
    roll_weights = build_engine_ledger(QWEN_MOE, eng, WORK, NODE, 1).term("weights")
    assert plan.sync_s == pytest.approx(roll_weights / NODE.nvlink_bytes_per_s)  # one node
    assert plan.train_s == estimate(QWEN_MOE, lay, NODE).step_s
    assert plan.times == rollout_time(QWEN_MOE, eng, WORK, NODE, 1)
    assert plan.step_s == pytest.approx(plan.times.round_s + plan.train_s + plan.switch_s
                                        + plan.sync_s)  # fmt: skip
    assert plan.overlapped_s == plan.step_s  # one pool cannot generate and train at once
    # the host holds every GPU's offloaded state beside CPU Adam's
    assert plan.host_per_node == train.host_per_node + 8 * state


def test_split_pools_keep_two_ledgers_and_sync_over_the_network():
    lay, eng = training_layout(BASE, WORK, 4), Engine(gpus=4, tp=2, ep=4)
    lay = replace(lay, cp=2, ep=4, dp=1)
    assert not layout_problems(QWEN_MOE, lay, 8)
    plan = split(QWEN_MOE, lay, eng, WORK, NODE, rollout_gpus=4)
    roll = build_engine_ledger(QWEN_MOE, eng, WORK, NODE, engines=1)
    assert dict(plan.phases) == {"train": build_layout_ledger(QWEN_MOE, lay, NODE).gpu_bytes,
                                 "rollout": roll.gpu_bytes}  # fmt: skip
    assert plan.switch_s == 0 and plan.resident == ()
    net = NODE.network_bytes_per_s
    model = 2 * QWEN_MOE.total_params
    assert plan.sync_s == pytest.approx(max(roll.term("weights") / net, model / (4 * net)))
    assert plan.overlapped_s == pytest.approx(max(plan.times.round_s, plan.train_s) + plan.sync_s)
    assert plan.overlapped_s < plan.step_s


def test_engines_for_lists_only_valid_engines():
    engines = engines_for(QWEN_MOE, 8, NODE, "bf16")
    assert Engine(gpus=8, tp=2, ep=8) in engines and Engine(gpus=1) in engines
    assert all(not engine_problems(QWEN_MOE, e, 8, 8) for e in engines)


def test_search_over_both_modes_ranks_fitting_plans_fastest_first():
    base = Layout(gpus=8, cpu_adam=True, recompute=True, distributed_optimizer=True)
    plans = search_pools(QWEN_MOE, base, WORK, NODE, 8, top=200)
    assert {p.mode for p in plans} == {"colocated", "split"}
    assert all(p.fits for p in plans)
    steps = [p.step_s for p in plans]
    assert steps == sorted(steps)
    for p in plans:
        assert p.layout.gpus + (p.rollout_gpus if p.mode == "split" else 0) == 8


# --- allgather CP -----------------------------------------------------------------------------
def test_allgather_cp_pairs_are_contiguous_and_less_balanced():
    assert cp_imbalance(8, 2, zigzag=False) == pytest.approx(26 * 2 / 36)
    assert cp_pair_counts(8, 2, zigzag=False) == [10, 26]
    assert cp_imbalance(131072, 4, zigzag=False) > cp_imbalance(131072, 4)


def test_allgather_cp_rules_need_only_cp_chunks():
    zig = Layout(gpus=4, cp=4, seq=12, global_batch=1)
    assert any("2 x CP = 8" in p for p in layout_problems(QWEN_MOE, zig, 8))
    gather = replace(zig, cp_comm="allgather")
    assert not any("seq" in p for p in layout_problems(QWEN_MOE, gather, 8))
    assert "cp-allgather" in gather.describe()
    with pytest.raises(ValueError, match="cp_comm"):
        Layout(gpus=1, cp_comm="ring")


def test_allgather_cp_holds_the_gathered_kv_and_exposes_the_gather():
    zig = Layout(gpus=8, tp=2, cp=4, ep=8, seq=65536, global_batch=8, recompute=True,
                 distributed_optimizer=True, cpu_adam=True)  # fmt: skip
    gather = replace(zig, cp_comm="allgather")
    w = stage_work(QWEN_MOE, gather, 0)
    kv_per_token = 2 * 4 * 128 * 2 // 2  # K and V of 4 KV heads, over TP 2
    assert w.cp_gather_bytes == 65536 * kv_per_token
    assert stage_work(QWEN_MOE, zig, 0).cp_gather_bytes == 0
    led_z, led_g = (
        build_layout_ledger(QWEN_MOE, zig, NODE),
        build_layout_ledger(QWEN_MOE, gather, NODE),
    )
    assert led_z.term("cp_gathered") == 0 and led_g.term("cp_gathered") == 2 * w.cp_gather_bytes
    assert led_g.gpu_bytes > led_z.gpu_bytes
    assert estimate(QWEN_MOE, gather, NODE).step_s > estimate(QWEN_MOE, zig, NODE).step_s
    run = simulate_layout(QWEN_MOE, gather, NODE)  # the graph and the closed form agree
    assert run.step_s == pytest.approx(estimate(QWEN_MOE, gather, NODE).step_s, rel=0.01)
