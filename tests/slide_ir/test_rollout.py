"""Rollout engines on paper: the rules, the KV cache against hand counts, the ledger, the verdict
and the advice, the round's time."""

from __future__ import annotations

import pytest

from slide_ir.layouts.cluster import load_cluster
from slide_ir.layouts.ledger import FRAGMENTATION
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.rollout import (
    PREFILL_CHUNK,
    Engine,
    RolloutWork,
    build_engine_ledger,
    check_engine,
    engine_advice,
    engine_problems,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    weight_bytes,
)
from slide_ir.layouts.rollout_cost import DecodeCosts, prefill_flops, rollout_time
from slide_ir.planning.compute_terms import CUDA_CONTEXT_BYTES
from slide_ir.specs.model import ModelSpec

NODE = load_cluster("h200-8gpu-node")
LLAMA = load_layout_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128
QWEN_MOE = load_layout_model("qwen3-30b-a3b")  # 48 layers, 4 KV heads of 128, 128 experts
DEEPSEEK = load_layout_model("deepseek-v3")  # 61 layers, MLA latent 512 + rope 64
GLM5 = load_layout_model("glm-5")  # 78 layers, MLA 512 + 64, DSA indexer key 128


# --- KV cache against hand counts ------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "engine", "per_layer"),
    [
        (LLAMA, Engine(gpus=1), 2 * 8 * 128 * 2),  # K and V, 8 heads x 128, BF16
        (LLAMA, Engine(gpus=2, tp=2), 2 * 4 * 128 * 2),  # TP splits the KV heads
        (LLAMA, Engine(gpus=8, tp=8), 2 * 1 * 128 * 2),
        (LLAMA, Engine(gpus=1, kv_dtype="fp8"), 2 * 8 * 128 * 1),
        (QWEN_MOE, Engine(gpus=8, tp=8, ep=8), 2 * 1 * 128 * 2),  # TP 8 > 4 heads: replicas
        (DEEPSEEK, Engine(gpus=8, tp=8), (512 + 64) * 2),  # one latent, whole on each rank
        (GLM5, Engine(gpus=8, tp=8, kv_dtype="fp8"), (512 + 64 + 128) * 1),
    ],
)
def test_kv_bytes_per_token_by_hand(spec, engine, per_layer):
    assert kv_bytes_per_token(spec, engine) == per_layer


def test_kv_of_a_sequence_by_hand():
    # Llama 3.1 8B: 128 KiB per token (32 layers x 4 KiB), the figure vLLM's docs and blogs give
    assert kv_bytes_per_sequence(LLAMA, Engine(gpus=1), 1) == 131072
    assert kv_bytes_per_sequence(LLAMA, Engine(gpus=1), 10_000) == 10_000 * 32 * 4096
    # Qwen3-30B-A3B: 48 layers x 2 x 4 heads x 128 x 2 B = 96 KiB per token
    assert kv_bytes_per_sequence(QWEN_MOE, Engine(gpus=1), 3) == 3 * 48 * 2048
    # DeepSeek-V3: 61 x 576 x 2 B = 70,272 B per token (the MLA cache DeepSeek-V2 reports)
    assert kv_bytes_per_sequence(DEEPSEEK, Engine(gpus=1), 1) == 70_272


def test_a_sliding_window_caps_the_tokens_kept():
    spec = ModelSpec(name="w", model_type="mistral", hidden_size=64, intermediate_size=128,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=100,
                     sliding_window=50)  # fmt: skip
    eng = Engine(gpus=1)
    assert kv_bytes_per_sequence(spec, eng, 40) == 40 * 2 * (2 * 2 * 16 * 2)
    assert kv_bytes_per_sequence(spec, eng, 400) == kv_bytes_per_sequence(spec, eng, 50)


# --- rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "engine", "pool", "rule"),
    [
        (LLAMA, Engine(gpus=3), 8, "--engine-gpus must divide the 8 rollout GPUs"),
        (LLAMA, Engine(gpus=4, tp=8), 8, "--engine-tp must divide the 4 GPUs of an engine"),
        (LLAMA, Engine(gpus=6, tp=6), 6, "--engine-tp must divide the 32 attention heads"),
        (QWEN_MOE, Engine(gpus=6, tp=3), 6, "--engine-tp must divide the 4 KV heads"),
        (LLAMA, Engine(gpus=16, tp=16), 16, "--engine-tp must divide the 8 GPUs of a node"),
        (LLAMA, Engine(gpus=1, ep=2), 8, "--engine-ep must be 1 for the dense model"),
        (QWEN_MOE, Engine(gpus=6, tp=2, ep=3), 6, "--engine-ep must divide the 128 experts"),
        (QWEN_MOE, Engine(gpus=4, tp=2, ep=8), 8, "--engine-ep must divide the 4 GPUs"),
        (QWEN_MOE, Engine(gpus=512, tp=8, ep=1), 512, "expert TP = engine GPUs / EP = 512"),
    ],
)
def test_every_invalid_engine_is_refused_with_its_rule(spec, engine, pool, rule):
    problems = engine_problems(spec, engine, pool, NODE.gpus_per_node)
    assert any(rule in p for p in problems), problems
    with pytest.raises(ValueError) as refused:
        check_engine(spec, engine, pool, NODE.gpus_per_node)
    assert str(refused.value) == problems[0]


def test_the_tensor_parallel_intermediate_rule():
    spec = ModelSpec(name="odd", model_type="llama", hidden_size=64, intermediate_size=130,
                     num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16, vocab_size=100)  # fmt: skip
    assert any("intermediate size 130" in p for p in engine_problems(spec, Engine(gpus=4, tp=4),
                                                                       4, 8))  # fmt: skip


def test_valid_engines_break_no_rule():
    for spec, eng, pool in ((QWEN_MOE, Engine(gpus=8, tp=2, ep=8), 8),
                            (GLM5, Engine(gpus=64, tp=8, ep=64), 256),
                            (LLAMA, Engine(gpus=2, tp=2), 32)):  # fmt: skip
        assert engine_problems(spec, eng, pool, 8) == []


@pytest.mark.parametrize(
    "bad", [{"gpus": 0}, {"gpus": 1, "tp": 0}, {"gpus": 1, "kv_dtype": "int4"}]
)
def test_engine_fields_are_checked(bad):
    with pytest.raises(ValueError):
        Engine(**bad)


# --- ledger -----------------------------------------------------------------------------------
def test_ledger_terms_by_hand():
    work = RolloutWork(prompts=1, samples=16, prompt_len=1000, response_len=3000, concurrency=16)
    eng = Engine(gpus=2, tp=2)
    led = build_engine_ledger(LLAMA, eng, work, NODE, engines=1)
    per_seq = 32 * 4000 * (2 * 4 * 128 * 2)
    assert led.kv_per_sequence == per_seq
    assert led.term("kv_cache") == 16 * per_seq  # DP attention 1: every sequence on each GPU
    assert led.term("weights") == 2 * -(-LLAMA.total_params // 2)
    chunk = PREFILL_CHUNK * (4 * 4096 + (4096 + 2 * 1024) // 2 + 3 * 14336 // 2) * 2
    assert led.term("workspace") == chunk + 16 * (128256 // 2) * 4
    assert led.term("allocator") == int(led.term("workspace") * FRAGMENTATION / (1 - FRAGMENTATION))
    assert led.term("context") == CUDA_CONTEXT_BYTES
    assert led.fits and led.gpu_bytes == sum(b for _, b in led.gpu_terms)
    assert led.max_batch == (led.gpu_capacity - led.gpu_bytes + led.term("kv_cache")) // per_seq


def test_attention_data_parallel_splits_the_sequences():
    work = RolloutWork(prompts=8, samples=8, prompt_len=1024, response_len=8192)
    dp8 = build_engine_ledger(QWEN_MOE, Engine(gpus=8, tp=1, ep=8), work, NODE, engines=1)
    tp8 = build_engine_ledger(QWEN_MOE, Engine(gpus=8, tp=8, ep=8), work, NODE, engines=1)
    assert dp8.term("kv_cache") == 64 // 8 * kv_bytes_per_sequence(QWEN_MOE, Engine(gpus=1), 9216)
    # TP 8 keeps one of 4 KV heads (replicated), so half a layer's KV of DP 8's 64 / 8 sequences
    assert tp8.term("kv_cache") == 64 * kv_bytes_per_sequence(QWEN_MOE, Engine(gpus=8, tp=8), 9216)
    assert weight_bytes(QWEN_MOE, Engine(gpus=8, tp=1, ep=8)) > weight_bytes(
        QWEN_MOE, Engine(gpus=8, tp=8, ep=8))  # fmt: skip


def test_too_much_concurrency_names_the_kv_cache_and_what_fits():
    work = RolloutWork(prompts=8, samples=8, prompt_len=2048, response_len=131072, concurrency=64)
    eng = Engine(gpus=2, tp=2)
    led = build_engine_ledger(LLAMA, eng, work, NODE, engines=4)
    assert not led.fits and led.overflow().startswith("kv_cache overflows")
    assert f"at most {led.max_batch} fit" in led.overflow()
    advice = engine_advice(LLAMA, eng, work, NODE, pool_gpus=8)
    assert any(a.startswith("--kv-dtype fp8") for a in advice)
    assert any(a.startswith("--engine-tp 4") for a in advice)
    assert advice[-1].startswith(f"--concurrency {led.max_batch}")
    fitted = RolloutWork(prompts=8, samples=8, prompt_len=2048, response_len=131072,
                         concurrency=led.max_batch)  # fmt: skip
    assert build_engine_ledger(LLAMA, eng, fitted, NODE, engines=4).fits


def test_weights_that_do_not_fit_are_named():
    big = load_layout_model("llama-3.1-405b")
    led = build_engine_ledger(big, Engine(gpus=1), RolloutWork(), NODE, engines=8)
    assert not led.fits and led.overflow().startswith("weights overflows")
    assert any("--engine-gpus 2" in a for a in engine_advice(big, Engine(gpus=1), RolloutWork(),
                                                              NODE, 8))  # fmt: skip


def test_without_concurrency_the_batch_is_what_the_kv_allows():
    work = RolloutWork(prompts=64, samples=16, prompt_len=1024, response_len=32768)
    led = build_engine_ledger(LLAMA, Engine(gpus=1), work, NODE, engines=1)
    assert led.fits and led.batch == led.max_batch < work.sequences
    t = rollout_time(LLAMA, Engine(gpus=1), work, NODE, 1, led)
    assert t.waves == -(-work.sequences // led.max_batch)


# --- time -------------------------------------------------------------------------------------
def test_a_decode_step_of_one_dense_gpu_by_hand():
    costs = DecodeCosts(LLAMA, Engine(gpus=1), NODE)
    hbm = costs.comm.base.rates.hbm
    seconds, bound = costs.step(4, 1000)
    want = (2 * LLAMA.total_params + 4 * kv_bytes_per_sequence(LLAMA, Engine(gpus=1), 1000)) / hbm
    assert bound == "memory" and seconds == pytest.approx(want)
    assert costs.collectives(4) == 0.0  # one GPU: none


def test_experts_read_per_step_grow_with_the_batch():
    costs = DecodeCosts(QWEN_MOE, Engine(gpus=8, tp=1, ep=8), NODE)
    assert costs.expert_share(1) == pytest.approx(8 / 128)
    assert costs.expert_share(2) == pytest.approx(1 - (120 / 128) ** 2)
    assert costs.expert_share(10_000) == pytest.approx(1.0)
    assert costs.collectives(8) > 0  # dispatch and combine over the engine's GPUs


def test_the_round_is_prefill_plus_decode():
    work = RolloutWork(prompts=2, samples=4, prompt_len=4096, response_len=2048)
    eng = Engine(gpus=1)
    t = rollout_time(LLAMA, eng, work, NODE, engines=2)
    assert t.sequences_per_engine == 4 and t.waves == 1
    flops, attn = prefill_flops(LLAMA, 4096)
    assert t.prefill_s == pytest.approx(
        (flops - attn) / DecodeCosts(LLAMA, eng, NODE).comm.base.rates.flops
        + attn / DecodeCosts(LLAMA, eng, NODE).comm.base.rates.attention
    )  # one prompt per engine: its 4 samples share the prefix
    mean = 4096 + (2048 + 1) / 2
    assert t.decode_s == pytest.approx(2048 * DecodeCosts(LLAMA, eng, NODE).step(4, mean)[0])
    assert t.round_s == t.prefill_s + t.decode_s
    assert t.decode_tokens_per_s_per_gpu == pytest.approx(4 * 2048 / t.decode_s)


def test_fp8_kv_decodes_faster_at_long_context():
    work = RolloutWork(prompts=8, samples=8, prompt_len=2048, response_len=65536)
    bf16 = rollout_time(QWEN_MOE, Engine(gpus=8, tp=2, ep=8), work, NODE, 1)
    fp8 = rollout_time(QWEN_MOE, Engine(gpus=8, tp=2, ep=8, kv_dtype="fp8"), work, NODE, 1)
    assert fp8.decode_s < bf16.decode_s
