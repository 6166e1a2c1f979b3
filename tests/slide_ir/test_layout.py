"""Layout planning on paper: rules, formulas, ledger, graph, costs, search."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from simulator.layout import simulate_layout
from slide_ir.ir.graph import Graph, OpKind, Work
from slide_ir.layouts.cluster import load_cluster
from slide_ir.layouts.cost import FA3_CAUSAL_CURVE, LayoutCosts, attention_efficiency
from slide_ir.layouts.graph import layout_graph, one_f_one_b
from slide_ir.layouts.ledger import FRAGMENTATION, build_layout_ledger, stage_terms
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import (
    Layout,
    bubble,
    check_layout,
    cp_pair_counts,
    in_flight_chunks,
    layout_problems,
)
from slide_ir.layouts.search import candidates, estimate, search, time_memory_front
from slide_ir.layouts.work import all_stages, stage_work

NODE = load_cluster("h200-8gpu-node")
QWEN_MOE = load_layout_model("qwen3-30b-a3b")
DENSE = load_layout_model("llama-3.1-8b")


# --- formulas ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("p", "m", "v", "want"),
    [
        (1, 8, 1, 0.0),
        (4, 4, 1, 3 / 7),
        (8, 64, 1, 7 / 71),
        (4, 4, 2, 3 / 11),
        (16, 16, 8, 15 / 143),
    ],
)
def test_bubble(p, m, v, want):
    """(p - 1) / (v m + p - 1): Narayanan et al.'s interleaved bubble (p - 1) / (v m) of the
    ideal time, as a share of the step."""
    assert bubble(p, m, v) == pytest.approx(want)


def test_zigzag_pair_counts_from_the_issue():
    assert cp_pair_counts(8, 2, zigzag=False) == [10, 26]
    assert cp_pair_counts(8, 2, zigzag=True) == [18, 18]


def test_zigzag_is_never_less_balanced_than_contiguous():
    rng = random.Random(0)
    for _ in range(200):
        cp = rng.choice([1, 2, 3, 4, 8, 16])
        seq = 2 * cp * rng.randint(1, 64)
        zig, flat = cp_pair_counts(seq, cp, zigzag=True), cp_pair_counts(seq, cp, zigzag=False)
        assert sum(zig) == sum(flat) == seq * (seq + 1) // 2
        assert max(zig) - min(zig) <= max(flat) - min(flat)


@pytest.mark.parametrize(
    ("stage", "per_param"),
    [
        (0, lambda d: 18),
        (1, lambda d: 6 + 12 / d),
        (2, lambda d: 2 + 16 / d),
        (3, lambda d: 18 / d),
    ],
)
def test_zero_formulas_in_the_layout_ledger(stage, per_param):
    """Model state of a dense model over D = DP replicas, as the issue states them."""
    lay = Layout(gpus=8, dp=8, zero=stage, seq=256)
    work = stage_work(DENSE, lay, 0)
    terms, _, _ = stage_terms(work, lay)
    state = sum(terms[k] for k in ("weights", "gradients", "master", "moments"))
    assert state == pytest.approx(per_param(8) * work.params, rel=1e-6)


def test_distributed_optimizer_is_zero1_memory_and_cpu_adam_moves_it_to_the_host():
    base = Layout(gpus=8, dp=8, seq=256)
    w = stage_work(DENSE, base, 0)
    dist, host, _ = stage_terms(w, replace(base, distributed_optimizer=True))
    zero1, _, _ = stage_terms(w, replace(base, zero=1))
    assert dist == zero1 and host == 0
    off, host, _ = stage_terms(w, replace(base, distributed_optimizer=True, cpu_adam=True))
    assert off["master"] == off["moments"] == 0
    assert host == -(-12 * w.params // 8) + -(-4 * w.params // 8)
    assert off["activations"] == dist["activations"]


# --- rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "layout", "rule"),
    [
        (DENSE, Layout(gpus=8, tp=2, dp=3), "N = TP x PP x CP x DP"),
        (QWEN_MOE, Layout(gpus=8, pp=2, ep=8, dp=4), "divisible by EP x PP"),
        (DENSE, Layout(gpus=8, ep=2, dp=8), "must be 1 for the dense model"),
        (QWEN_MOE, Layout(gpus=24, ep=3, dp=24), "must divide the 128 experts"),
        (DENSE, Layout(gpus=24, tp=3, dp=8), "attention heads"),
        (load_layout_model("qwen2.5-7b"), Layout(gpus=7, tp=7, dp=1), "4 KV heads"),
        (DENSE, Layout(gpus=24, pp=3, dp=8), "must divide the 32 layers.*--pp-layers 11,11,10"),
        (DENSE, Layout(gpus=24, pp=3, dp=8, pp_layers=(10, 11, 10)), "summing to the 32"),
        (DENSE, Layout(gpus=64, pp=64, dp=1), "at most the 32 layers"),
        (DENSE, Layout(gpus=16, pp=2, dp=8, pp_layers=(16, 8, 8)), "give 2 stage sizes"),
        (DENSE, Layout(gpus=8, dp=8, virtual_stages=2), "needs --pp > 1"),
        (DENSE, Layout(gpus=8, pp=4, dp=2, micro_batches=6, virtual_stages=2), "multiple of PP"),
        (DENSE, Layout(gpus=8, pp=8, dp=1, micro_batches=8, virtual_stages=8), "fewer than its 8"),
        (DENSE, Layout(gpus=16, tp=16, dp=1), "GPUs of a node"),
        (DENSE, Layout(gpus=8, cp=8, dp=1, seq=4104), "2 x CP = 16"),
        (DENSE, Layout(gpus=8, dp=8, global_batch=12), "multiple of DP x micro-batch"),
    ],
)
def test_every_rule_is_refused_with_its_name(model, layout, rule):
    with pytest.raises(ValueError, match=rule):
        check_layout(model, layout, 8)


def test_kv_heads_may_be_replicated_when_tp_is_a_multiple():
    assert not layout_problems(load_layout_model("llama-3.1-70b"), Layout(gpus=8, tp=8), 8)


def test_zero_and_distributed_optimizer_are_exclusive():
    with pytest.raises(ValueError, match="pick one"):
        Layout(gpus=8, zero=1, distributed_optimizer=True)


# --- collectives ------------------------------------------------------------------------------
def test_collective_message_bytes():
    lay = Layout(gpus=64, tp=2, pp=4, cp=2, ep=8, dp=4, seq=4096, micro_batch_size=2)
    w = stage_work(QWEN_MOE, lay, 1)
    tokens, h = 2 * 4096, QWEN_MOE.hidden_size
    assert (w.layers, w.moe_layers) == (12, 12)
    # MoE layers: only attention is tensor-parallel (experts run at expert TP 1); tokens / CP
    assert w.tp_bytes == 12 * tokens // 2 * h * 2
    assert w.ep_bytes == 2 * 12 * 8 * tokens * h * 2 // 4  # dispatch + combine, top-8
    assert w.pp_bytes == tokens * h * 2 // 4
    kv = 2 * QWEN_MOE.kv_dim * 2  # K and V per token, BF16; 4 KV heads over TP 2
    assert w.cp_bytes == (2 - 1) * 12 * tokens // 2 * kv // 2


def test_ring_formulas_and_link_choice():
    lay = Layout(gpus=64, tp=8, pp=2, dp=4)
    c = LayoutCosts(NODE, lay)
    assert c.bandwidth("tp") == NODE.nvlink_bytes_per_s
    assert c.bandwidth("dp") == NODE.network_bytes_per_s  # 4 ranks 8 apart: across nodes
    b = 1e9
    assert c.collective_seconds(OpKind.ALL_REDUCE, "tp", b) == pytest.approx(2 * 7 / 8 * b / 370e9)
    assert c.collective_seconds(OpKind.REDUCE_SCATTER, "dp", b) == pytest.approx(3 / 4 * b / 46e9)
    assert c.collective_seconds(OpKind.SEND_RECV, "pp", b) == pytest.approx(b / 46e9)


def test_attention_efficiency_follows_the_fa3_curve():
    top = FA3_CAUSAL_CURVE[-1][1]
    for tokens, tflops in FA3_CAUSAL_CURVE:
        assert attention_efficiency(tokens) == pytest.approx(tflops / top)
    assert attention_efficiency(131072) == attention_efficiency(16384) == 1.0
    assert attention_efficiency(128) == attention_efficiency(512)
    lengths = [2**k for k in range(8, 18)] + [3000, 6000]
    effs = [attention_efficiency(n) for n in sorted(lengths)]
    assert effs == sorted(effs)


def test_context_parallel_shortens_attention_kernels_tensor_parallel_does_not():
    work = Work(flops=1e15, attn_flops=1e15)
    by_tp = LayoutCosts(NODE, Layout(gpus=8, tp=8, seq=16384)).compute_seconds(work)
    by_cp = LayoutCosts(NODE, Layout(gpus=8, cp=8, seq=16384)).compute_seconds(work)
    rated = 1e15 / LayoutCosts(NODE, Layout(gpus=8)).base.rates.attention
    assert by_tp == pytest.approx(rated)  # 16K-token kernels: the rate as catalogued
    assert by_cp == pytest.approx(rated / attention_efficiency(2048))  # 16K / CP 8
    measured_at_2k = replace(NODE, attention_ref_seq=2048)
    long = LayoutCosts(measured_at_2k, Layout(gpus=8, tp=8, seq=16384)).compute_seconds(work)
    assert long == pytest.approx(rated * attention_efficiency(2048))  # faster than measured


def test_fragmentation_covers_the_tensors_that_come_and_go():
    lay = Layout(gpus=8, tp=2, cp=4, ep=8, seq=32768, recompute=True, distributed_optimizer=True)
    terms, _, _ = stage_terms(stage_work(QWEN_MOE, lay, 0), lay)
    churn = terms["activations"] + terms["logits"] + terms["comm_buffers"]
    assert terms["fragmentation"] == int(churn * FRAGMENTATION / (1 - FRAGMENTATION))


# --- graph, simulation, search ----------------------------------------------------------------
def test_one_f_one_b_order():
    assert one_f_one_b(4, 4, 0) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0),
                                    ("B", 1), ("B", 2), ("B", 3)]  # fmt: skip
    assert one_f_one_b(4, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                    ("B", 2), ("F", 3), ("B", 3)]  # fmt: skip


@pytest.mark.parametrize(
    "lay",
    [
        Layout(gpus=64, tp=2, pp=4, cp=2, ep=8, dp=4, seq=4096, recompute=True, zero=1),
        Layout(gpus=16, tp=2, pp=2, ep=4, dp=4, seq=2048, cpu_adam=True, micro_batches=3),
        Layout(gpus=16, pp=4, ep=4, dp=4, seq=1024, zero=3),
        Layout(
            gpus=32,
            tp=2,
            pp=2,
            ep=8,
            dp=8,
            seq=4096,
            micro_batches=4,
            recompute_modules=("layernorm", "moe"),
            distributed_optimizer=True,
        ),
        Layout(
            gpus=16,
            pp=4,
            ep=4,
            dp=4,
            seq=2048,
            micro_batches=8,
            virtual_stages=2,
            recompute=True,
            distributed_optimizer=True,
        ),
        Layout(
            gpus=32,
            tp=2,
            pp=4,
            ep=8,
            dp=4,
            seq=2048,
            micro_batches=8,
            virtual_stages=4,
            pp_layers=(11, 13, 13, 11),
            cpu_adam=True,
            deepep=True,
        ),
    ],
)
def test_layout_graph_validates_and_simulation_matches_the_estimate(lay):
    check_layout(QWEN_MOE, lay, 8)
    graph = layout_graph(QWEN_MOE, lay, NODE.name)
    assert Graph.from_json(graph.to_json()) == graph  # same validation as any graph
    assert graph.pool("acts0").slots == in_flight_chunks(lay.pp, lay.m, lay.virtual_stages, 0)
    run = simulate_layout(QWEN_MOE, lay, NODE)
    # ZeRO-3's per-micro-batch gathers queue behind scatters on the DP lane: the closed form
    # assumes they hide behind compute; measured 20% short on this case.
    rel = 0.25 if lay.zero == 3 else 0.01
    assert run.step_s == pytest.approx(estimate(QWEN_MOE, lay, NODE).step_s, rel=rel)
    assert 0 < run.mfu < 1


def test_simulated_idle_follows_the_bubble():
    lay = Layout(gpus=8, pp=8, seq=1024, micro_batches=8)
    run = simulate_layout(DENSE, lay, NODE)
    assert bubble(8, 8) - 0.01 <= run.gpu_idle < 1  # unequal stages only add idle time


def test_search_returns_only_valid_fitting_layouts_fastest_first():
    base = Layout(gpus=16, seq=8192, global_batch=32, recompute=True, distributed_optimizer=True)
    ranked = search(QWEN_MOE, base, NODE, top=1000)
    assert ranked and len(ranked) <= len(candidates(QWEN_MOE, base, 8))
    for lay, _ in ranked:
        assert not layout_problems(QWEN_MOE, lay, 8)
        assert build_layout_ledger(QWEN_MOE, lay, NODE).fits
    speeds = [e.tokens_per_s for _, e in ranked]
    assert speeds == sorted(speeds, reverse=True)


STARTING = [  # global batch as in THUDM/slime's RL scripts (GLM-5's assumed): bench/RESULTS.md
    ("qwen3-30b-a3b", 8, (2, 1, 4, 8), 32),
    ("glm-4.5", 64, (8, 4, 2, 16), 256),
    ("glm-5", 256, (4, 8, 8, 32), 256),  # 78 layers on PP8: 9,10,...,10,9
    ("qwen3-32b", 32, (4, 2, 4, 1), 256),  # the catalog's nearest to the issue's 27B dense
]


@pytest.mark.parametrize(("model", "gpus", "dims", "batch"), STARTING)
@pytest.mark.parametrize("node", ["h200-8gpu-node", "h100-8gpu-node"])
def test_published_starting_layouts_are_on_the_time_memory_front(model, gpus, dims, batch, node):
    """The issue's starting layouts (8-GPU nodes, 128K tokens, CPU Adam, recompute) are among
    the layouts `--search` ranks, and for their GPU memory none is predicted faster. By step
    time alone they are not first (bench/RESULTS.md: they leave memory free)."""
    spec, cluster = load_layout_model(model), load_cluster(node)
    base = Layout(gpus=gpus, seq=131072, cpu_adam=True, recompute=True,
                  distributed_optimizer=True, global_batch=batch)  # fmt: skip
    found = [(x.tp, x.pp, x.cp, x.ep) for x, _ in search(spec, base, cluster, top=100_000)]
    assert dims in found
    front = [(x.tp, x.pp, x.cp, x.ep) for x, _, _ in time_memory_front(spec, base, cluster)]
    assert dims in front


def test_time_memory_front_keeps_exactly_the_undominated_layouts():
    base = Layout(gpus=16, seq=8192, global_batch=32, recompute=True, distributed_optimizer=True)
    rows = [(lay, e.step_s, build_layout_ledger(QWEN_MOE, lay, NODE).gpu_bytes)
            for lay, e in search(QWEN_MOE, base, NODE, top=1000)]  # fmt: skip
    front = {lay for lay, _, _ in time_memory_front(QWEN_MOE, base, NODE)}

    def beaten(t: float, b: int) -> bool:
        return any(u <= t and c <= b and (u, c) != (t, b) for _, u, c in rows)

    assert {lay for lay, t, b in rows if not beaten(t, b)} <= front
    assert not any(beaten(t, b) for lay, t, b in rows if lay in front)
    assert rows[0][0] in front  # the fastest layout is on it


def test_stages_cover_the_model():
    lay = Layout(gpus=16, pp=4, ep=4, dp=4)
    works = all_stages(QWEN_MOE, lay)
    dense = sum(w.dense_params for w in works)
    experts = sum(w.expert_params for w in works) * lay.ep
    assert dense + experts == QWEN_MOE.total_params
