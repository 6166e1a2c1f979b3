"""The shape curves and their grid correction against hand-computed values."""

import math
import shlex
from dataclasses import replace

import pytest

from slide_ir.ir.graph import Attention, Gemm, Op, OpKind, Work
from slide_ir.ir.printing import _parse_op as parse_op
from slide_ir.ir.printing import format_op
from slide_ir.planning.cost import CostModel
from slide_ir.planning.gpu_rates import (
    REF_ATTENTION,
    Correction,
    ShapeRates,
    attention_efficiency,
    gemm_efficiency,
    reference_gemms,
)
from slide_ir.planning.shapes import layer_work, loss_gemms, recompute_work
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine, load_machine_toml, machine_to_toml
from slide_ir.specs.hardware_parts import default_optimizer_threads, parse_grid, scale_grid
from slide_ir.specs.model_catalog import load_model

H200 = load_machine("h200-16c-128g")


def test_gemm_efficiency_by_hand():
    g = Gemm(m=128, n=256, k=128)
    assert gemm_efficiency(g, None) == pytest.approx(1.0 * 128 / 256)  # one full tile, K ramp
    # 132 SMs: 128x256 fills 1 of 132, 128x128 two (x0.95), 64x128 four (x0.85): the last wins
    assert gemm_efficiency(g, 132) == pytest.approx(0.85 * 4 / 132 * 0.5)
    ragged = Gemm(m=129, n=256, k=128)  # a second row of tiles, nearly empty
    assert gemm_efficiency(ragged, None) == pytest.approx(129 * 256 / (192 * 256) * 0.85 * 0.5)


def test_attention_efficiency_by_hand():
    a = Attention(batch=1, heads=1, seq=256, head_dim=64)
    # 2 query blocks: 1 + 2 blocks of 128 x 128 computed for 256^2 / 2 model pairs; hd 64 / 128
    assert attention_efficiency(a, None) == pytest.approx(32768 / 49152 * 0.5)
    assert attention_efficiency(a, 132) == pytest.approx(32768 / 49152 * 0.5 * 2 / 132)
    windowed = Attention(batch=1, heads=1, seq=512, head_dim=64, window=128)
    # 4 blocks, each query block sees at most 2 key blocks: 1 + 2 + 2 + 2 computed
    pairs = 512 * 128 - 128 * 128 / 2
    assert attention_efficiency(windowed, None) == pytest.approx(pairs / (7 * 128 * 128) * 0.5)


def test_a_masked_attention_computes_every_block_for_the_causal_pairs():
    """Packed documents' explicit mask: SDPA's masked kernel skips no block, so per model FLOP
    (causal pairs) its efficiency is the causal pairs over all of them."""
    a = Attention(batch=1, heads=1, seq=256, head_dim=64, masked=True)
    assert attention_efficiency(a, None) == pytest.approx(32768 / 65536 * 0.5)


def test_masked_attention_at_the_profiles_measured_rate_else_the_curve():
    ref_masked = replace(REF_ATTENTION, masked=True)
    curve = ShapeRates(H200.gpu, matmul=700e12, attention=300e12, hbm=4e12)
    blocks = REF_ATTENTION.seq // 128
    every_block = (blocks * (blocks + 1) / 2) / (blocks * blocks)  # causal blocks / all blocks
    assert curve.attention_flops_per_s(ref_masked) == pytest.approx(300e12 * every_block)
    measured = ShapeRates(replace(H200.gpu, masked_attention_tflops=90.0), matmul=700e12,
                          attention=300e12, hbm=4e12)  # fmt: skip
    assert measured.attention_flops_per_s(ref_masked) == pytest.approx(90e12)
    assert measured.attention_flops_per_s(REF_ATTENTION) == pytest.approx(300e12)  # unmasked
    longer = replace(ref_masked, seq=4096, batch=2)  # moves with the curve, as the causal does
    ratio = measured.attention_flops_per_s(longer) / curve.attention_flops_per_s(longer)
    assert ratio == pytest.approx(90e12 / (300e12 * every_block))


def test_packed_documents_price_the_masked_kernel_and_leave_the_model_flops():
    model = load_model("llama-3.2-1b")
    plain, packed = (layer_work(model, TrainConfig(batch=2, seq=4096, document_mask=m),
                                backward=True) for m in (False, True))  # fmt: skip
    assert packed.attention is not None and packed.attention.masked
    assert (packed.flops, packed.attn_flops) == (plain.flops, plain.attn_flops)
    cost = CostModel(H200)
    assert cost.compute_seconds(packed) > cost.compute_seconds(plain)


def test_the_curve_reproduces_the_profile_rate_at_the_reference_shapes():
    rates = ShapeRates(H200.gpu, matmul=700e12, attention=300e12, hbm=4e12)
    ref = reference_gemms()
    seconds = sum(rates.gemm_seconds(g) for g in ref)
    assert sum(g.flops for g in ref) / seconds == pytest.approx(700e12)
    assert rates.attention_flops_per_s(REF_ATTENTION) == pytest.approx(300e12)
    small = Gemm(m=512, n=1152, k=896)
    assert rates.gemm_flops_per_s(small) < 0.8 * 700e12  # small and ragged: slower


def test_a_grid_point_is_exact_and_between_points_is_interpolated():
    gpu = replace(H200.gpu, gemm_grid="1024x1024x1024:100 4096x1024x1024:400")
    rates = ShapeRates(gpu, matmul=700e12, attention=300e12, hbm=4e12)
    assert rates.gemm_flops_per_s(Gemm(m=1024, n=1024, k=1024)) == pytest.approx(100e12)
    assert rates.gemm_flops_per_s(Gemm(m=4096, n=1024, k=1024)) == pytest.approx(400e12)
    # m = 2048 is one log2 step from each: equal weights, the geometric mean of the two ratios
    plain = ShapeRates(H200.gpu, matmul=700e12, attention=300e12, hbm=4e12)
    ratio = [
        r * 1e12 / plain.gemm_flops_per_s(Gemm(m=m, n=1024, k=1024))
        for m, r in ((1024, 100), (4096, 400))
    ]
    mid = Gemm(m=2048, n=1024, k=1024)
    want = plain.gemm_flops_per_s(mid) * math.sqrt(ratio[0] * ratio[1])
    assert rates.gemm_flops_per_s(mid) == pytest.approx(want)


def test_correction_without_points_is_one():
    assert Correction.fit([]).at((5, 6, 7)) == 1.0


def test_grid_text_round_trips_scales_and_refuses_bad_points():
    assert parse_grid("8x16x32:1.5 4x4x4:2") == (((8, 16, 32), 1.5), ((4, 4, 4), 2.0))
    assert parse_grid(scale_grid("8x16x32:1.5", 2.0)) == (((8, 16, 32), 3.0),)
    for bad in ("8x16x32", "8x16x32:abc", "8x0x32:1", "x:1", "8x16x32:-1"):
        with pytest.raises(ValueError, match="bad grid point"):
            parse_grid(bad)
    with pytest.raises(ValueError, match="bad grid point"):
        replace(H200.gpu, attention_grid="4x32x2048:oops")


def test_a_profile_without_grids_loads_and_prices_by_the_curve():
    """An older profile (no sm_count, no grids) is read as it is: the derived curve alone."""
    text = machine_to_toml(H200)
    old = "\n".join(line for line in text.splitlines() if not line.startswith("sm_count"))
    machine = load_machine_toml(old)
    assert machine.gpu.gemm_grid is None and machine.gpu.sm_count is None
    work = layer_work(load_model("llama-3.2-1b"), TrainConfig(batch=2, seq=512), backward=True)
    assert 0 < CostModel(machine).compute_seconds(work) < 1


def test_a_recompute_skips_the_mlp_tail_the_backward_redoes_the_swiglu():
    """llama-3.1-8b at 2 x 512 tokens: the recompute is the forward less the down GEMM
    (1024 x 4096 x 14336), the SwiGLU (6 B x 14336 a token) and the last residual add (6 B x
    4096); the backward moves the SwiGLU's bytes on top of twice the forward's."""
    model, cfg = load_model("llama-3.1-8b"), TrainConfig(batch=2, seq=512)
    fwd, bwd = (layer_work(model, cfg, backward=b) for b in (False, True))
    again = recompute_work(model, cfg)
    t = 1024
    assert fwd.gemms[-1] == Gemm(m=t, n=4096, k=14336)
    assert again.gemms == fwd.gemms[:-1] and again.attention == fwd.attention
    assert again.flops == fwd.flops - 2 * t * 4096 * 14336
    assert again.bytes == fwd.bytes - t * (6 * 14336 + 6 * 4096)
    assert bwd.bytes == 2 * fwd.bytes + t * 6 * 14336


def test_layer_and_loss_shapes_carry_the_models_flops():
    model, cfg = load_model("qwen2.5-1.5b"), TrainConfig(batch=3, seq=256)
    for backward in (False, True):
        w = layer_work(model, cfg, backward=backward)
        assert sum(g.flops for g in w.gemms) == pytest.approx(w.flops - w.attn_flops)
        assert w.attention == Attention(batch=3, heads=12, seq=256, head_dim=128)
    gemms = loss_gemms(hidden=1536, vocab=151936, tokens=768, chunk=512)  # one full, one of 256
    assert [g.count for g in gemms] == [1, 1, 1, 1, 1, 1] and gemms[3].m == 256
    want = model.head_fwd_flops(3, 256) + model.head_bwd_flops(3, 256)
    assert sum(g.flops for g in gemms) == pytest.approx(want)


def test_shapes_print_and_parse_back():
    work = Work(flops=1e9, gemms=(Gemm(m=64, n=96, k=32), Gemm(m=64, n=32, k=32, count=2)),
                attention=Attention(batch=1, heads=4, seq=64, head_dim=8, window=16))  # fmt: skip
    op = Op(id="s1.L1.fwd", kind=OpKind.FWD, lane="gpu", step=1, unit=1, work=work)
    tokens = shlex.split(format_op(op))
    kv = dict(t.split("=", 1) for t in tokens[2:])
    assert kv["gemms"] == "64x96x32,64x32x32*2" and kv["attention"] == "1x4x64x8w16"
    assert parse_op(op.id, kv) == op
    for masked in ("1x4x64x8m", "1x4x64x8w16m"):
        assert str(Attention.parse(masked)) == masked and Attention.parse(masked).masked


def test_one_thread_rule():
    assert [default_optimizer_threads(c) for c in (16, 5, 3)] == [12, 1, 1]
    assert default_optimizer_threads(16, 2) == 6
    assert CostModel(H200).threads == H200.cpu.optimizer_threads() == H200.cpu.cores - 4
    assert CostModel(H200, nproc=2).threads == (H200.cpu.cores - 4) // 2
