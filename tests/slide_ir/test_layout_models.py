"""MoE catalog entries: parameter counts against transformers and the published totals."""

from __future__ import annotations

import json

import pytest

from slide_ir.layouts.cluster import cluster_names, load_cluster
from slide_ir.layouts.models import load_layout_model, moe_model_names
from slide_ir.specs import moe
from slide_ir.specs.hf_config import ModelConfigError
from slide_ir.specs.model_catalog import UnknownModelError, load_model, model_names

# Published totals (model cards; DeepSeek's README_WEIGHTS.md): (total, tolerance).
PUBLISHED = {
    "qwen3-30b-a3b": (30.5e9, 0.05e9),
    "qwen3-235b-a22b": (235e9, 0.5e9),
    "deepseek-v3": (671e9, 0.5e9),
    # 355B includes the multi-token-prediction layer (~4B) that transformers does not build.
    "glm-4.5": (355e9, 0.01 * 355e9),
    # GLM-5 README: 744B total, 40B active (multi-token-prediction layer not built).
    "glm-5": (744e9, 0.5e9),
}


def test_catalog_has_the_moe_models_and_keeps_them_out_of_the_dense_one():
    assert set(moe_model_names()) >= set(PUBLISHED)
    assert not set(moe_model_names()) & set(model_names())
    with pytest.raises(UnknownModelError):
        load_model("qwen3-30b-a3b")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_params_match_the_published_figure(name):
    total, tol = PUBLISHED[name]
    spec = load_layout_model(name)
    assert spec.is_moe and spec.source
    assert abs(spec.total_params - total) <= tol


def test_deepseek_activated_params_match_its_readme():
    """README_WEIGHTS.md: 36.6B activated including the 0.9B output head (embedding excluded)."""
    spec = load_layout_model("deepseek-v3")
    assert moe.active_params(spec) - spec.embedding_params == pytest.approx(36.6e9, abs=0.05e9)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_params_match_transformers_exactly(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = load_layout_model(name)
    config = transformers.AutoConfig.for_model(**spec.to_hf_config())
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    for i, layer in enumerate(model.model.layers, start=1):
        if i in (1, spec.num_layers):
            assert moe.layer_params(spec, i) == sum(p.numel() for p in layer.parameters())


def test_glm5_activated_params_match_its_readme():
    spec = load_layout_model("glm-5")
    assert moe.active_params(spec) - spec.embedding_params == pytest.approx(40e9, abs=1e9)


def test_flops_follow_active_params():
    spec = load_layout_model("qwen3-30b-a3b")
    per_token = spec.linear_fwd_flops(1, 1) / 2
    assert per_token == moe.active_matmul_params(spec, spec.num_layers)
    assert spec.layer_params > 10 * per_token  # memory follows all 128 experts


def test_moe_config_errors_name_the_file_and_field(tmp_path):
    config = json.loads(load_layout_model("qwen3-30b-a3b").hf_config_json)
    config["num_experts_per_tok"] = 500
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="experts_per_token must be in") as info:
        load_layout_model(str(path))
    assert str(path) in str(info.value)


def test_dense_models_are_unchanged_by_the_moe_fields():
    spec = load_layout_model("llama-3.1-8b")
    assert not spec.is_moe and spec == load_model("llama-3.1-8b")
    assert spec.total_params == 8_030_261_248


@pytest.mark.parametrize("name", cluster_names())
def test_cluster_profiles_load_with_sources(name):
    node = load_cluster(name)
    assert node.gpus_per_node == 8 and node.nvlink_bytes_per_s > node.network_bytes_per_s
    assert all(src.strip() for _, src in node.sources)
    assert {"h200-8gpu-node", "h100-8gpu-node"} <= set(cluster_names())


def test_unknown_cluster_lists_the_known_ones():
    with pytest.raises(ValueError, match="h200-8gpu-node"):
        load_cluster("h200-8gpu")
