"""Models for layout planning: the dense catalog plus mixture-of-experts configs.

`load_layout_model(name)` finds a catalog name of `catalog/moe_models/*.json` (published HF
configs of MoE models, each with its `_source`), else a config.json / model directory of a MoE
type, else falls back to `slide_ir.specs.model_catalog.load_model` (the dense catalog). MoE
configs are read here, not by `load_model`, because only the layout planner handles them: the
single-GPU planner and the executor build identical dense layers.

Field names per architecture (transformers' configs):
- qwen3_moe: `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`; every layer MoE
  (`mlp_only_layers` empty, `decoder_sparse_step` 1, else refused); q/k RMSNorm per head.
- glm4_moe / deepseek_v3 / glm_moe_dsa: `n_routed_experts`, `n_shared_experts`,
  `first_k_dense_replace`; glm4_moe has `use_qk_norm`, q/k/v bias from `attention_bias` and no
  o_proj bias; deepseek_v3 and glm_moe_dsa have multi-head latent attention (`q_lora_rank`,
  `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`); glm_moe_dsa's sparse
  attention indexer (`index_topk`, `index_n_heads`, `index_head_dim`) is read by `slide_ir.specs.moe`
  from the config kept in the spec.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from slide_ir.specs.hf_config import ModelConfigError, _get, _rope
from slide_ir.specs.model import MOE_MODEL_TYPES, ModelSpec
from slide_ir.specs.model_catalog import UnknownModelError, load_model, model_names


def _catalog_dir() -> Path:
    return Path(str(resources.files("slide_ir") / "catalog" / "moe_models"))


def moe_model_names() -> list[str]:
    """MoE catalog entries (what `slide layout` knows beyond `slide models`), sorted."""
    return sorted(p.stem for p in _catalog_dir().glob("*.json"))


def layout_model_names() -> list[str]:
    return sorted(model_names() + moe_model_names())


def _experts(config: Mapping[str, Any], model_type: str, origin: str) -> dict[str, Any]:
    if model_type == "qwen3_moe":
        if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
            raise ModelConfigError(
                f"{origin}: fields 'mlp_only_layers'/'decoder_sparse_step' mix dense and MoE "
                "layers other than a dense prefix; only every-layer MoE is supported"
            )
        return {"num_experts": _get(config, "num_experts", int, origin), "shared_experts": 0,
                "dense_layers": 0}  # fmt: skip
    return {
        "num_experts": _get(config, "n_routed_experts", int, origin),
        "shared_experts": _get(config, "n_shared_experts", int, origin, 0),
        "dense_layers": _get(config, "first_k_dense_replace", int, origin, 0),
    }


def _attention(config: Mapping[str, Any], model_type: str, origin: str) -> dict[str, Any]:
    bias = _get(config, "attention_bias", bool, origin, False)
    if model_type not in ("deepseek_v3", "glm_moe_dsa"):
        heads = _get(config, "num_attention_heads", int, origin)
        hidden = _get(config, "hidden_size", int, origin)
        qk_norm = model_type == "qwen3_moe" or _get(config, "use_qk_norm", bool, origin, False)
        return {"head_dim": _get(config, "head_dim", int, origin, hidden // heads),
                "attention_bias": bias, "o_proj_bias": bias and model_type == "qwen3_moe",
                "qk_norm": qk_norm}  # fmt: skip
    nope = _get(config, "qk_nope_head_dim", int, origin)
    rope = _get(config, "qk_rope_head_dim", int, origin)
    return {
        "head_dim": nope + rope,
        "qk_rope_head_dim": rope,
        "v_head_dim": _get(config, "v_head_dim", int, origin),
        "q_lora_rank": config.get("q_lora_rank") or 0,
        "kv_lora_rank": _get(config, "kv_lora_rank", int, origin),
        "attention_bias": bias,
    }


def moe_spec_from_config(config: Mapping[str, Any], *, name: str, origin: str) -> ModelSpec:
    """A ModelSpec from a MoE HF config dict; errors name `origin` and the field."""
    model_type = _get(config, "model_type", str, origin)
    if model_type not in MOE_MODEL_TYPES:
        raise ModelConfigError(
            f"{origin}: field 'model_type' is {model_type!r}; MoE types: {', '.join(MOE_MODEL_TYPES)}"
        )
    heads = _get(config, "num_attention_heads", int, origin)
    theta, rope_type = _rope(config, origin)
    try:
        return ModelSpec(
            name=name,
            model_type=model_type,
            hidden_size=_get(config, "hidden_size", int, origin),
            intermediate_size=_get(config, "intermediate_size", int, origin),
            num_layers=_get(config, "num_hidden_layers", int, origin),
            num_heads=heads,
            num_kv_heads=_get(config, "num_key_value_heads", int, origin, heads),
            vocab_size=_get(config, "vocab_size", int, origin),
            tied_embeddings=_get(config, "tie_word_embeddings", bool, origin, False),
            rms_norm_eps=_get(config, "rms_norm_eps", float, origin, 1e-6),
            rope_theta=theta,
            rope_type=rope_type,
            max_position_embeddings=_get(config, "max_position_embeddings", int, origin, 4096),
            hidden_act=_get(config, "hidden_act", str, origin, "silu"),
            experts_per_token=_get(config, "num_experts_per_tok", int, origin),
            moe_intermediate_size=_get(config, "moe_intermediate_size", int, origin),
            **_experts(config, model_type, origin),
            **_attention(config, model_type, origin),
            source=str(config.get("_source", config.get("_name_or_path", ""))),
            hf_config_json=json.dumps(dict(config), sort_keys=True),
        )
    except ValueError as e:
        raise ModelConfigError(f"{origin}: {e}") from e


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}: not valid JSON ({e})") from e


def load_layout_model(name_or_path: str) -> ModelSpec:
    """A MoE catalog name or config path, else whatever `load_model` accepts."""
    catalog = _catalog_dir() / f"{name_or_path.lower()}.json"
    if "/" not in name_or_path and catalog.is_file():
        return moe_spec_from_config(_read(catalog), name=catalog.stem, origin=str(catalog))
    path = Path(name_or_path).expanduser()
    path = path / "config.json" if path.is_dir() else path
    if path.is_file():
        config = _read(path)
        if isinstance(config, Mapping) and config.get("model_type") in MOE_MODEL_TYPES:
            name = path.parent.name if path.name == "config.json" else path.stem
            return moe_spec_from_config(config, name=name, origin=str(path))
    try:
        return load_model(name_or_path)
    except UnknownModelError:
        close = difflib.get_close_matches(name_or_path.lower(), layout_model_names(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownModelError(
            f"unknown model {name_or_path!r}: not a catalog name (dense or MoE) nor a config.json."
            f"{hint} Known: {', '.join(layout_model_names())}"
        ) from None
