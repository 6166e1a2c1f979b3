"""HF checkpoints: names match transformers, saves load with from_pretrained, writes are atomic."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from slide.weights import (
    CheckpointError,
    RandomInit,
    initial_weights,
    param_names,
    param_shape,
    save_checkpoint,
)
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model

TINY = {
    "model_type": "qwen3",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 96,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
}


def hf_model(spec):
    config = AutoConfig.for_model(**spec.to_hf_config())
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(
    "spec", [load_model("tiny-llama"), ModelSpec.from_hf_config(TINY, name="q3")]
)
def test_names_and_shapes_match_transformers(spec):
    sd = hf_model(spec).state_dict()
    if spec.tied_embeddings:
        sd.pop("lm_head.weight")
    assert param_names(spec) == list(sd)
    assert all(param_shape(spec, n) == tuple(sd[n].shape) for n in sd)


def test_random_init_is_seeded_and_lazy():
    spec = load_model("tiny-llama")
    a, b, c = RandomInit(spec, 0), RandomInit(spec, 0), RandomInit(spec, 1)
    name = "model.layers.2.mlp.up_proj.weight"
    assert torch.equal(a[name], b[name]) and not torch.equal(a[name], c[name])
    assert abs(a[name].std().item() - 0.02) < 0.002
    assert torch.equal(a["model.norm.weight"], torch.ones(64))


@pytest.mark.parametrize(
    "spec", [load_model("tiny-llama"), ModelSpec.from_hf_config(TINY, name="q3")]
)
def test_saved_checkpoint_loads_in_transformers(tmp_path, spec):
    state = dict(RandomInit(spec, 3))
    out = save_checkpoint(tmp_path / "ckpt", spec, state, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(out)
    got = model.state_dict()
    for name, tensor in state.items():
        torch.testing.assert_close(got[name], tensor)
    again = initial_weights(spec, out, seed=99)  # weights present: the seed is not used
    torch.testing.assert_close(again["model.norm.weight"], state["model.norm.weight"])


def test_checkpoint_config_names_the_dtype_written(tmp_path):
    """A BF16 input's config says "bfloat16"; the FP32 weights written beside it say float32."""
    spec = ModelSpec.from_hf_config(
        TINY | {"dtype": "bfloat16", "torch_dtype": "bfloat16"}, name="q3"
    )
    out = save_checkpoint(tmp_path / "ckpt", spec, dict(RandomInit(spec, 3)), dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "float32"
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert model.model.norm.weight.dtype == torch.float32


def test_resave_replaces_whole_and_failure_keeps_the_old(tmp_path):
    spec = load_model("tiny-llama")
    out = save_checkpoint(tmp_path / "c", spec, dict(RandomInit(spec, 1)))
    first = (out / "model.safetensors").read_bytes()
    broken = dict(RandomInit(spec, 2))
    broken.pop("lm_head.weight")
    with pytest.raises(KeyError):
        save_checkpoint(tmp_path / "c", spec, broken)
    assert (out / "model.safetensors").read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # no partial directory left behind


def test_sharded_save(tmp_path, monkeypatch):
    import slide.weights as ck

    monkeypatch.setattr(ck, "SHARD_BYTES", 40_000)
    spec = load_model("tiny-llama")
    out = save_checkpoint(tmp_path / "s", spec, dict(RandomInit(spec, 4)), dtype=torch.float32)
    assert (out / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(
        model.state_dict()["lm_head.weight"], RandomInit(spec, 4)["lm_head.weight"]
    )


def test_corrupt_and_mismatched_checkpoints_are_named(tmp_path):
    spec = load_model("tiny-llama")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        initial_weights(spec, tmp_path / "bad", seed=0)
    other = ModelSpec.from_hf_config(TINY, name="q3")
    out = save_checkpoint(tmp_path / "q3", other, dict(RandomInit(other, 0)))
    with pytest.raises(CheckpointError, match="lacks"):
        initial_weights(spec, out, seed=0)
