"""Layout planning, second part: uneven pipeline splits, the interleaved schedule, what full
recompute re-runs, sparse (DSA) attention, node-deduplicated EP dispatch."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from simulator.layout import simulate_layout
from slide_ir.ir.graph import OpKind
from slide_ir.layouts.cluster import load_cluster
from slide_ir.layouts.cost import LayoutCosts
from slide_ir.layouts.graph import interleaved_order, layout_graph, one_f_one_b
from slide_ir.layouts.ledger import stage_terms
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import Layout, balanced_split, bubble, check_layout, in_flight_chunks
from slide_ir.layouts.search import estimate
from slide_ir.layouts.work import all_stages, stage_layers, stage_work
from slide_ir.specs import moe

NODE = load_cluster("h200-8gpu-node")
QWEN_MOE = load_layout_model("qwen3-30b-a3b")
DENSE = load_layout_model("llama-3.1-8b")
GLM5 = load_layout_model("glm-5")


# --- uneven stages ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layers", "pp", "want"),
    [
        (78, 8, (9, 10, 10, 10, 10, 10, 10, 9)),  # GLM-5 on PP8
        (126, 16, (7, *[8] * 14, 7)),  # Llama 3 405B: one layer fewer on the first and last
        (94, 8, (11, 12, 12, 12, 12, 12, 12, 11)),  # Qwen3-235B
        (61, 8, (7, 8, 8, 8, 8, 8, 7, 7)),  # DeepSeek-V3
        (32, 4, (8, 8, 8, 8)),
    ],
)
def test_balanced_split(layers, pp, want):
    assert balanced_split(layers, pp) == want


def test_balanced_split_properties():
    rng = random.Random(1)
    for _ in range(300):
        pp = rng.randint(1, 32)
        layers = rng.randint(pp, 200)
        split = balanced_split(layers, pp)
        assert len(split) == pp and sum(split) == layers and max(split) - min(split) <= 1
        if pp > 2:  # the first and last stage hold the embedding and the head: never the most
            assert split[0] <= split[1] and split[-1] <= split[1]


def test_explicit_split_covers_the_model():
    split = (9, 10, 10, 10, 10, 10, 10, 9)
    lay = Layout(gpus=256, tp=4, pp=8, cp=8, ep=32, dp=1, seq=131072, global_batch=64,
                 pp_layers=split)  # fmt: skip
    check_layout(GLM5, lay, 8)
    ranges = [stage_layers(GLM5, lay, s) for s in range(8)]
    assert [len(r) for r in ranges] == list(split)
    assert [i for r in ranges for i in r] == list(range(1, 79))
    works = all_stages(GLM5, lay)
    assert sum(w.dense_params for w in works) * lay.tp + sum(
        w.expert_params for w in works
    ) * lay.ep == pytest.approx(GLM5.total_params, rel=1e-6)  # TP splits round up


# --- interleaved 1F1B -------------------------------------------------------------------------
def test_interleaved_order_matches_megatron():
    """p = 2, m = 2, v = 2: stage 0 warms up all four chunks; stage 1 two, then alternates."""
    assert interleaved_order(2, 2, 2, 0) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
        ("B", 0, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0),
    ]  # fmt: skip
    assert interleaved_order(2, 2, 2, 1) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1),
        ("F", 1, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0),
    ]  # fmt: skip
    assert interleaved_order(4, 8, 1, 2) == [(w, j, 0) for w, j in one_f_one_b(4, 8, 2)]


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 4, 4), (8, 16, 3)])
def test_interleaved_order_runs_every_unit_once_forward_first(p, m, v):
    for s in range(p):
        order = interleaved_order(p, m, v, s)
        assert Counter(order) == Counter((w, j, c) for w in "FB" for j in range(m)
                                         for c in range(v))  # fmt: skip
        seen = set()
        held = 0
        for what, j, c in order:
            if what == "F":
                seen.add((j, c))
                held += 1
            else:
                assert (j, c) in seen
                held -= 1
            assert held <= in_flight_chunks(p, m, v, s)


def test_interleaving_shrinks_the_simulated_bubble():
    """A dense model on 8 stages of one node: idle time follows (p - 1) / (v m + p - 1)."""
    base = Layout(gpus=8, pp=8, dp=1, seq=1024, micro_batches=8)
    idle = {}
    for v in (1, 2, 4):
        lay = replace(base, virtual_stages=v)
        run = simulate_layout(DENSE, lay, NODE)
        assert run.bubble == pytest.approx(bubble(8, 8, v))
        assert run.gpu_idle >= bubble(8, 8, v) - 0.01
        assert run.step_s == pytest.approx(estimate(DENSE, lay, NODE).step_s, rel=0.02)
        idle[v] = run.gpu_idle
    assert idle[1] > idle[2] > idle[4]


def test_interleaved_activations_count_chunks():
    lay = Layout(gpus=16, pp=4, ep=4, dp=4, seq=2048, micro_batches=8, virtual_stages=2)
    w = stage_work(QWEN_MOE, lay, 0)
    terms, _, in_flight = stage_terms(w, lay)
    assert in_flight == 2 * 3 + 1 * 4 + 1  # Megatron's warm-up + the chunk in progress
    assert terms["activations"] == -(-in_flight * w.act_bytes // 2)
    graph = layout_graph(QWEN_MOE, lay, NODE.name)
    assert graph.pool("acts0").slots == in_flight
    assert "s1.m0.S0.c1.fwd" in {op.id for op in graph.ops}


# --- what each pass moves ---------------------------------------------------------------------
def test_full_recompute_reruns_every_collective_of_the_forward():
    lay = Layout(gpus=16, tp=2, cp=2, ep=4, dp=4, seq=4096, micro_batches=2)
    plain, again = (
        estimate(QWEN_MOE, lay, NODE),
        estimate(QWEN_MOE, replace(lay, recompute=True), NODE),
    )
    assert again.comm_s["tp"] == pytest.approx(1.5 * plain.comm_s["tp"])
    assert again.comm_s["ep"] == pytest.approx(1.5 * plain.comm_s["ep"])
    ids = {op.id for op in layout_graph(QWEN_MOE, replace(lay, recompute=True), NODE.name).ops}
    assert {"s1.m0.S0.tp.re", "s1.m0.S0.ep.re", "s1.m0.S0.cp.re"} <= ids


def test_tp_blocks_of_dense_and_moe_layers():
    """A dense layer has two tensor-parallel blocks, an MoE layer (expert TP 1) one; the first
    stage adds the vocab-parallel embedding, the last the LM head."""
    lay = Layout(gpus=8, tp=2, pp=4, dp=1)
    assert [stage_work(DENSE, lay, s).tp_blocks for s in range(4)] == [17, 16, 16, 17]
    lay = Layout(gpus=16, tp=2, pp=4, ep=4, dp=2)
    assert [stage_work(QWEN_MOE, lay, s).tp_blocks for s in range(4)] == [13, 12, 12, 13]


# --- sparse attention (GLM-5) -----------------------------------------------------------------
def test_dsa_attention_flops():
    """Each query attends to min(i + 1, top-k) keys; the indexer scores every causal pair."""
    topk, heads, dim = moe.dsa_indexer(GLM5)
    assert (topk, heads, dim) == (2048, 32, 128)
    per_pair = 2 * GLM5.num_heads * (GLM5.head_dim + GLM5.v_head_dim)
    s = 131072
    want = per_pair * (s * topk - topk * topk / 2) + 2 * heads * dim * s * s / 2
    assert moe.attention_fwd_flops(GLM5, 1, s) == pytest.approx(want)
    short = 1024  # shorter than top-k: every causal key, as dense attention
    want = per_pair * short * short / 2 + 2 * heads * dim * short * short / 2
    assert moe.attention_fwd_flops(GLM5, 1, short) == pytest.approx(want)
    assert moe.dsa_indexer(load_layout_model("deepseek-v3")) == (0, 0, 0)


def test_dsa_context_parallel_moves_the_latent():
    lay = Layout(gpus=256, tp=4, pp=8, cp=8, ep=32, dp=1, seq=131072, global_batch=64,
                 pp_layers=balanced_split(78, 8))  # fmt: skip
    w = stage_work(GLM5, lay, 1)
    latent = (GLM5.kv_lora_rank + GLM5.qk_rope_head_dim) * 2  # MQA mode: one per token, whole
    assert w.cp_bytes == 7 * w.layers * 131072 // 8 * latent


# --- node-deduplicated EP dispatch ------------------------------------------------------------
def test_deepep_sends_a_token_once_per_remote_node():
    lay = Layout(gpus=64, tp=8, pp=4, cp=2, ep=16, dp=1)
    b = 1e9
    plain = LayoutCosts(NODE, lay, experts_per_token=8)
    dedup = LayoutCosts(NODE, replace(lay, deepep=True), experts_per_token=8)
    net, nvl = NODE.network_bytes_per_s, NODE.nvlink_bytes_per_s
    assert plain.collective_seconds(OpKind.ALL_TO_ALL, "ep", b) == pytest.approx(b / 2 / net)
    remote = b / 8 * (1 - 0.5**8)  # 2 nodes, top-8: the other node is needed 1 - 2^-8 times
    assert dedup.collective_seconds(OpKind.ALL_TO_ALL, "ep", b) == pytest.approx(remote / net)
    inside = Layout(gpus=64, tp=8, pp=4, cp=2, ep=8, dp=1, deepep=True)  # one node: no change
    assert LayoutCosts(NODE, inside, experts_per_token=8).collective_seconds(
        OpKind.ALL_TO_ALL, "ep", b
    ) == pytest.approx(b * 7 / 8 / nvl)
