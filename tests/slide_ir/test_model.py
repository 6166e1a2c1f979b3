"""ModelSpec against transformers (parameter counts), hand counts, and the loader's errors.

Parameter parity builds every catalog model on the meta device: no memory, no weights, and the
405B model takes about two seconds.
"""

import json
import subprocess
import sys

import pytest

from slide_ir.specs.hf_config import ModelConfigError
from slide_ir.specs.model import DTYPE_BYTES, ModelSpec
from slide_ir.specs.model_catalog import UnknownModelError, load_model, model_names

# Totals published for the real checkpoints (sum of safetensors shapes).
KNOWN_TOTALS = {
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "qwen2.5-7b": 7_615_616_512,
    "mistral-7b": 7_248_023_552,
    "qwen3-8b": 8_190_735_360,
}
REQUIRED_NAMES = {
    "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
    "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b",
    "qwen2.5-72b", "qwen3-8b", "qwen3-32b", "mistral-7b", "mistral-large-2",
}  # fmt: skip


def tiny(**overrides: object) -> ModelSpec:
    """hidden 8, 2 heads of 4, 1 kv head, intermediate 16, vocab 32, 2 layers, untied llama."""
    fields: dict[str, object] = dict(
        name="tiny", model_type="llama", hidden_size=8, intermediate_size=16, num_layers=2,
        num_heads=2, num_kv_heads=1, head_dim=4, vocab_size=32,
    )  # fmt: skip
    return ModelSpec(**{**fields, **overrides})  # type: ignore[arg-type]


def build_meta(spec: ModelSpec):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**spec.to_hf_config())
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


# --- catalog vs transformers ---------------------------------------------------------------------


def test_catalog_has_the_required_models():
    assert set(model_names()) >= REQUIRED_NAMES


@pytest.mark.parametrize("name", model_names())
def test_params_match_transformers(name):
    spec = load_model(name)
    model = build_meta(spec)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    layer = model.model.layers[0]
    assert spec.layer_params == sum(p.numel() for p in layer.parameters())
    linears = [m for m in layer.modules() if type(m).__name__ == "Linear"]
    assert len(linears) == 7
    assert spec.layer_matmul_params == sum(m.weight.numel() for m in linears)
    assert spec.embedding_params == model.model.embed_tokens.weight.numel()
    assert spec.final_norm_params == model.model.norm.weight.numel()
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == spec.tied_embeddings
    assert spec.lm_head_params == (0 if tied else model.lm_head.weight.numel())


@pytest.mark.parametrize("name", model_names())
def test_hf_config_round_trip(name):
    spec = load_model(name)
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**spec.to_hf_config())
    derived = config.hidden_size // config.num_attention_heads  # qwen2 has no head_dim key
    assert getattr(config, "head_dim", derived) == spec.head_dim
    assert config.rope_parameters["rope_type"] == spec.rope_type
    assert config.rope_parameters["rope_theta"] == spec.rope_theta
    assert spec.source and spec.source == json.loads(spec.hf_config_json)["_source"]


@pytest.mark.parametrize(("name", "total"), KNOWN_TOTALS.items())
def test_known_totals(name, total):
    assert load_model(name).total_params == total


@pytest.mark.parametrize(
    ("name", "tied", "qk_norm", "bias", "head_dim", "rope_type"),
    [
        ("llama-3.2-1b", True, False, False, 64, "llama3"),
        ("llama-3.2-3b", True, False, False, 128, "llama3"),
        ("llama-3.1-8b", False, False, False, 128, "llama3"),
        ("qwen2.5-0.5b", True, False, True, 64, "default"),
        ("qwen2.5-3b", True, False, True, 128, "default"),
        ("qwen2.5-7b", False, False, True, 128, "default"),
        ("qwen3-8b", False, True, False, 128, "default"),
        ("mistral-7b", False, False, False, 128, "default"),
    ],
)
def test_architecture_flags(name, tied, qk_norm, bias, head_dim, rope_type):
    spec = load_model(name)
    assert (spec.tied_embeddings, spec.qk_norm, spec.attention_bias) == (tied, qk_norm, bias)
    assert (spec.head_dim, spec.rope_type) == (head_dim, rope_type)
    assert not spec.o_proj_bias


def test_catalog_shapes():
    assert load_model("mistral-7b").vocab_size == 32768
    large = load_model("mistral-large-2")
    assert (large.num_layers, large.hidden_size) == (88, 12288)
    assert 122e9 < large.total_params < 124e9


# --- FLOPs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", model_names())
def test_flops_match_kaplan(name):
    """Training FLOPs = 6*N*T + 6*n_layer*n_ctx*d_attn*T (Kaplan et al. 2020, Table 1, x3 for
    forward + backward): N = non-embedding params, counting the LM head matrix (tied or not) as it
    is a matmul and the input embedding not (a lookup); d_attn = heads*head_dim; the attention
    term is already the causal average (n_ctx/2 keys per query, for QK^T and AV each).
    The brief asks for 2%; the only gap is norm weights and biases (< 0.1% for the real models,
    0.3% for the 64-wide tiny-llama), so 5e-3 is asserted.
    """
    spec = load_model(name)
    b, s = 2, 1024
    tokens = b * s
    ours = spec.num_layers * (spec.layer_fwd_flops(b, s) + spec.layer_bwd_flops(b, s))
    ours += spec.head_fwd_flops(b, s) + spec.head_bwd_flops(b, s)
    n = spec.total_params - spec.embedding_params - spec.lm_head_params
    n += spec.vocab_size * spec.hidden_size
    d_attn = spec.num_heads * spec.head_dim
    kaplan = 6 * n * tokens + 6 * spec.num_layers * s * d_attn * tokens
    assert ours == pytest.approx(kaplan, rel=5e-3)


def test_tiny_hand_count():
    spec = tiny()
    # Params: q 8x8=64, k 8x4=32, v 32, o 64, gate/up/down 3x8x16=384 -> 576 matmul weights;
    # + 2 RMSNorms of 8 = 592 per layer. Total 2*592 + embed 32*8=256 + norm 8 + head 256 = 1704.
    assert (spec.layer_matmul_params, spec.layer_params, spec.total_params) == (576, 592, 1704)
    assert sum(p.numel() for p in build_meta(spec).parameters()) == 1704
    assert spec.layer_bytes("bf16") == 1184 and spec.layer_bytes("fp32") == 2368
    assert spec.flops_per_token_6n == 6 * 1704
    # b=1, s=4 -> 4 tokens. Linears: 2*4*576 = 4608.
    assert spec.linear_fwd_flops(1, 4) == 4608
    # Attention, causal half: 4*4/2 = 8 (query, key) pairs per head; each matmul (QK^T, AV) is
    # 2 flops * 8 pairs * head_dim 4 = 64 per head; 2 matmuls * 2 heads * 64 = 256.
    assert spec.attention_fwd_flops(1, 4) == 256
    assert spec.layer_fwd_flops(1, 4) == 4864
    assert spec.layer_bwd_flops(1, 4) == 9728
    # Head: 2*4*8*32 = 2048; backward twice that.
    assert (spec.head_fwd_flops(1, 4), spec.head_bwd_flops(1, 4)) == (2048, 4096)


def test_sliding_window_caps_attention():
    spec = tiny(model_type="mistral", sliding_window=2)
    # s=4, w=2: s*w - w^2/2 = 6 pairs per head (exact count with diagonal would be 7).
    assert spec.attention_fwd_flops(1, 4) == 2 * 2 * 2 * 6 * 4
    assert tiny(model_type="mistral", sliding_window=8).attention_fwd_flops(1, 4) == 256


# --- bytes ---------------------------------------------------------------------------------------


def test_tiny_activation_bytes():
    spec = tiny()
    t = 1 * 4  # tokens
    assert spec.layer_input_bytes(1, 4) == t * 8 * 2  # 64
    saved = spec.layer_saved_terms(1, 4)
    # bf16 unless noted: norm1.out 4*8*2=64; rstd fp32 2*4*4=32; v, copied out of the q/k/v
    # projection, 4*4*2=32; post-RoPE q and k 4*(8+4)*2=96; attn.out 4*8*2=64; lse fp32 2 heads*4*4
    # =32; resid 64; norm2.out 64; gate|up 2*4*16*2=256 (the SwiGLU product and the layer's output
    # are no part of the tape: the backward recomputes the one and its root holds no data).
    expected = {
        "norm1.out": 64, "norm.rstd": 32, "v": 32, "qk.rope": 96, "attn.out": 64,
        "attn.lse": 32, "resid": 64, "norm2.out": 64, "mlp.gate_up": 256,
    }  # fmt: skip
    assert saved == expected
    total = sum(expected.values())  # 704
    # SwiGLU moment: d_prod 4*16*2=128, d(gate|up) 256 and down's weight gradient 8*16*2=256
    # -> 704+640=1344.
    # Attention moment: gate|up, resid, norm2.out freed (-384); d_resid 64, d_attn_out 64,
    # dq/dk/dv 128, fp32 dq accumulator 4*8*4=128, row scratch 32 -> 736. d_out is not counted
    # here: it is a hidden-gradient slot of the ledger.
    assert total + 640 == 1344
    assert spec.layer_transient_bytes(1, 4) == 1344


def test_qk_norm_adds_its_saved_inputs():
    spec = tiny(model_type="qwen3", qk_norm=True)
    # q,k pre-norm 4*(8+4)*2 = 96, rstd per (token, head) fp32 4*(2+1)*4 = 48.
    assert spec.layer_saved_terms(1, 4)["qk_norm"] == 144
    assert spec.layer_params == 592 + 2 * 4


def test_logits_bytes():
    spec = load_model("llama-3.1-8b")
    v = 128256
    assert spec.logits_bytes(2, 1024, fused=False) == 2048 * v * 10
    assert spec.logits_bytes(2, 1024, fused=True, chunk_tokens=256) == 256 * v * 2
    assert spec.logits_bytes(1, 16, fused=True, chunk_tokens=256) == 16 * v * 2
    with pytest.raises(ValueError, match="chunk_tokens"):
        spec.logits_bytes(2, 1024, fused=True)


def test_default_lce_chunk_tokens():
    spec = load_model("llama-3.1-8b")
    assert spec.default_lce_chunk_tokens(2**29) == 2048  # 2^29 / (128256*2) = 2093.1
    assert spec.default_lce_chunk_tokens(2048 * 128256 * 2) == 2048  # exact fit
    assert spec.default_lce_chunk_tokens(2048 * 128256 * 2 - 1) == 1024
    assert spec.default_lce_chunk_tokens(0) == 1


def test_dtype_bytes():
    assert dict(DTYPE_BYTES) == {"fp32": 4, "bf16": 2, "fp16": 2}
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        tiny().layer_bytes("int8")


# --- validation and loading --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_layers": 0}, "num_layers must be an integer >= 1"),
        ({"num_kv_heads": 3}, "num_kv_heads must divide num_heads"),
        ({"model_type": "gpt2"}, "model_type must be one of llama, mistral, qwen2, qwen3"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps must be in"),
        ({"hidden_size": True}, "hidden_size must be an integer"),
    ],
)
def test_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny(**overrides)


def test_spec_is_frozen_and_hashable():
    spec = load_model("qwen3-8b")
    assert hash(spec) == hash(load_model("Qwen3-8B"))
    with pytest.raises(AttributeError):
        spec.num_layers = 1  # type: ignore[misc]


def write_config(tmp_path, config, name="my-model"):
    directory = tmp_path / name
    directory.mkdir()
    path = directory / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return directory, path


def test_load_from_directory_and_file(tmp_path):
    config = load_model("qwen2.5-0.5b").to_hf_config()
    directory, path = write_config(tmp_path, config)
    for arg in (str(directory), str(path)):
        spec = load_model(arg)
        assert spec.name == "my-model"
        assert spec.total_params == load_model("qwen2.5-0.5b").total_params


def test_load_by_hf_repo_id():
    assert load_model("meta-llama/Llama-3.1-8B").name == "llama-3.1-8b"


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownModelError, match="slide models") as info:
        load_model("llama-3.1-8")
    assert "llama-3.1-8b" in str(info.value)


def test_malformed_json_names_the_file(tmp_path):
    _, path = write_config(tmp_path, "{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON") as info:
        load_model(str(path))
    assert str(path) in str(info.value)


def test_missing_field_names_field_and_file(tmp_path):
    config = load_model("llama-3.2-1b").to_hf_config()
    del config["intermediate_size"]
    directory, path = write_config(tmp_path, config)
    with pytest.raises(ModelConfigError, match="missing field 'intermediate_size'") as info:
        load_model(str(directory))
    assert str(path) in str(info.value)


def test_wrong_type_names_field(tmp_path):
    config = {**load_model("llama-3.2-1b").to_hf_config(), "num_hidden_layers": "16"}
    directory, _ = write_config(tmp_path, config)
    with pytest.raises(ModelConfigError, match="'num_hidden_layers' must be int"):
        load_model(str(directory))


def test_out_of_range_field_names_file(tmp_path):
    config = {**load_model("llama-3.2-1b").to_hf_config(), "num_key_value_heads": 5}
    _, path = write_config(tmp_path, config)
    with pytest.raises(ModelConfigError, match="num_kv_heads must divide") as info:
        load_model(str(path))
    assert str(path) in str(info.value)


def test_unsupported_model_type(tmp_path):
    directory, _ = write_config(tmp_path, {"model_type": "gpt2", "n_embd": 768})
    with pytest.raises(ModelConfigError, match="'gpt2'; supported: llama, mistral, qwen2, qwen3"):
        load_model(str(directory))


def test_sliding_window_layers_refused(tmp_path):
    config = {**load_model("qwen2.5-7b").to_hf_config(), "use_sliding_window": True}
    directory, _ = write_config(tmp_path, config)
    with pytest.raises(ModelConfigError, match="use_sliding_window"):
        load_model(str(directory))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelConfigError, match=r"no config\.json"):
        load_model(str(tmp_path))


def test_transformers_v5_rope_parameters():
    config = load_model("llama-3.1-8b").to_hf_config()
    rope = {**config.pop("rope_scaling"), "rope_theta": config.pop("rope_theta")}
    spec = ModelSpec.from_hf_config({**config, "rope_parameters": rope}, name="v5")
    assert (spec.rope_theta, spec.rope_type) == (500000.0, "llama3")


def test_hand_built_spec_synthesises_a_config():
    config = tiny(tied_embeddings=True).to_hf_config()
    assert config["num_hidden_layers"] == 2 and config["tie_word_embeddings"] is True
    assert ModelSpec.from_hf_config(config, name="tiny").total_params == 1704 - 256


def test_slide_ir_model_imports_no_torch():
    code = "import sys, slide_ir.specs.model; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
