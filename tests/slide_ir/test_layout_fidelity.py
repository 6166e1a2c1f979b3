"""The layout model's fidelity terms, each on a small case with hand-computed numbers:
selective recompute (what it keeps, what it runs again) and the GEMM roofline at few rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slide_ir.ir.graph import OpKind
from slide_ir.layouts.cluster import load_cluster
from slide_ir.layouts.cost import LayoutCosts
from slide_ir.layouts.graph import layout_graph
from slide_ir.layouts.ledger import stage_terms
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import Layout, layout_problems
from slide_ir.layouts.search import estimate
from slide_ir.layouts.work import (
    Gemm,
    activation_terms,
    all_stages,
    moe_block_fwd,
    recompute_bytes_per_token,
    recomputed_terms,
    stage_work,
)

H100 = load_cluster("h100-8gpu-node")  # 792.1 TFLOP/s matmul, 3,350 GB/s HBM (catalog)
QWEN235 = load_layout_model("qwen3-235b-a22b")  # h 4096, 128 experts, top-8, expert FFN 1536
QWEN30 = load_layout_model("qwen3-30b-a3b")
DENSE = load_layout_model("llama-3.1-8b")
RATE, HBM = 792.1e12, 3350e9


# --- GEMM roofline ----------------------------------------------------------------------------
def test_weight_gradient_into_fp32_main_grad_is_memory_bound_at_few_rows():
    costs = LayoutCosts(H100, Layout(gpus=8))
    assert costs.base.rates.flops == pytest.approx(RATE)
    assert costs.base.rates.hbm == pytest.approx(HBM)
    # a routed expert's fc1 at 512 tokens: (512 x 4096) @ (4096 x 3072)
    fwd, dgrad, wgrad = costs.gemm_roofline(Gemm(m=512, k=4096, n=3072, count=1))
    compute = 2 * 512 * 4096 * 3072 / RATE  # 16.27 us
    # forward: 2 (512 x 4096 + 4096 x 3072 + 512 x 3072) = 32,505,856 B = 9.70 us < compute
    assert fwd == dgrad == 0.0
    # weight gradient: 2 (512 x 4096 + 512 x 3072) + 8 x 4096 x 3072 = 108,003,328 B = 32.24 us
    assert wgrad == pytest.approx(108_003_328 / HBM - compute)
    assert wgrad == pytest.approx(15.97e-6, rel=1e-3)
    # at 4,096 rows every pass is compute-bound: nothing added
    assert costs.gemm_roofline(Gemm(m=4096, k=4096, n=3072, count=1)) == (0.0, 0.0, 0.0)
    # the weight gradient's crossover: 14,336 M + 100,663,296 = M x 25,165,824 x HBM / RATE,
    # M = 1,093 rows at these rates and shapes (4 x ridge = 946 without the activations' bytes)
    assert costs.gemm_roofline(Gemm(m=1080, k=4096, n=3072, count=1))[2] > 0
    assert costs.gemm_roofline(Gemm(m=1110, k=4096, n=3072, count=1))[2] == 0


def test_expert_gemms_see_their_tokens_per_expert():
    # TP4 EP8, 4,096 tokens: 1,024 per GPU x top-8 x 8 ranks / 128 experts = 512 rows each
    lay = Layout(gpus=256, tp=4, pp=8, ep=8, dp=8, seq=4096, global_batch=2048,
                 pp_layers=(11, *(12,) * 6, 11))  # fmt: skip
    w = stage_work(QWEN235, lay, 1)
    experts = [g for g in w.gemms if g.moe]
    assert [(g.m, g.k, g.n, g.count) for g in experts] == [
        (512, 4096, 3072, 12 * 16), (512, 1536, 4096, 12 * 16)]  # fmt: skip
    costs = LayoutCosts(H100, lay, experts_per_token=8, works=all_stages(QWEN235, lay))
    per_fc1 = costs.gemm_roofline(experts[0])[2]
    per_fc2 = costs.gemm_roofline(experts[1])[2]
    assert costs.gemm_excess(1, OpKind.BWD) == pytest.approx(192 * (per_fc1 + per_fc2))
    assert costs.gemm_excess(1, OpKind.FWD) == 0.0
    # EP32 TP2: 2,048 x 8 x 32 / 128 = 4,096 rows: compute-bound, no excess
    wide = replace(lay, tp=2, ep=32, dp=16)
    costs = LayoutCosts(H100, wide, experts_per_token=8, works=all_stages(QWEN235, wide))
    assert costs.gemm_excess(1, OpKind.BWD) == 0.0


# --- selective recompute ----------------------------------------------------------------------
def test_recomputed_terms_and_their_bytes():
    h, im, k, e = 4096, 1536, 8, 128
    moe_layer, terms = 5, activation_terms(QWEN235, 5)
    dropped = recomputed_terms(QWEN235, moe_layer, ("layernorm", "moe"))
    # two BF16 norm outputs, FP32 router scores, every routed copy's input, gate/up, product
    assert sum(terms[t] for t in dropped) == 2 * h * 2 + e * 4 + k * (h + 3 * im) * 2  # 156,160
    act = recomputed_terms(QWEN235, moe_layer, ("moe_act",))
    assert sum(terms[t] for t in act) == k * im * 2
    assert recompute_bytes_per_token(QWEN235, moe_layer, ("layernorm",)) == 8 * h
    assert recompute_bytes_per_token(QWEN235, moe_layer, ("moe_act",)) == 6 * k * im
    assert recompute_bytes_per_token(QWEN235, moe_layer, ("moe_act", "moe")) == 0  # in the block
    flops, _ = moe_block_fwd(QWEN235, moe_layer, 1, 4096)
    assert flops == 2 * 4096 * (e * h + k * 3 * h * im)
    assert moe_block_fwd(DENSE, 1, 1, 4096) == (0.0, 0)


def test_selective_recompute_sits_between_none_and_full():
    lay = Layout(gpus=32, tp=2, pp=2, ep=8, dp=8, seq=4096, micro_batches=4)
    sel = replace(lay, recompute_modules=("layernorm", "moe"))
    none, part, full = (estimate(QWEN30, x, H100) for x in
                        (lay, sel, replace(lay, recompute=True)))  # fmt: skip
    assert none.step_s < part.step_s < full.step_s
    # the MoE block's all-to-all runs a third time, TP's does not
    assert part.comm_s["ep"] == pytest.approx(1.5 * none.comm_s["ep"])
    assert part.comm_s["tp"] == pytest.approx(none.comm_s["tp"])
    ids = {op.id for op in layout_graph(QWEN30, sel, H100.name).ops}
    assert "s1.m0.S0.ep.re" in ids and "s1.m0.S0.tp.re" not in ids
    # memory: the dropped tensors leave every in-flight micro-batch, one layer's worth comes back
    w0, s0 = stage_work(QWEN30, lay, 0), stage_work(QWEN30, sel, 0)
    dropped = (
        sum(
            sum(
                activation_terms(QWEN30, i)[t]
                for t in recomputed_terms(QWEN30, i, sel.recompute_modules)
            )
            for i in range(1, 25)
        )
        * 4096
        // 2
    )
    assert w0.act_bytes - s0.act_bytes == dropped
    assert s0.recompute_peak_bytes == dropped // 24
    full_terms, _, flight = stage_terms(w0, lay)
    sel_terms, _, _ = stage_terms(s0, sel)
    assert full_terms["activations"] - sel_terms["activations"] == flight * dropped - dropped // 24


def test_selective_recompute_rules():
    with pytest.raises(ValueError, match="exclude each other"):
        Layout(gpus=8, recompute=True, recompute_modules=("layernorm",))
    with pytest.raises(ValueError, match="recompute_modules"):
        Layout(gpus=8, recompute_modules=("attention",))
    problems = layout_problems(DENSE, Layout(gpus=8, recompute_modules=("moe",)), 8)
    assert any("need an MoE model" in p for p in problems)
    assert not layout_problems(DENSE, Layout(gpus=8, recompute_modules=("layernorm",)), 8)
