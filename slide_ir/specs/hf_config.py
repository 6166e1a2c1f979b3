"""Reading a Hugging Face config.json into a ModelSpec, and synthesising one for a hand-built spec.

Every error names the file (`origin`) and the field: a config that cannot be read as a supported
model raises `ModelConfigError`, a field out of range included. `ModelSpec.from_hf_config` and
`to_hf_config` call in here; this module imports `slide_ir.specs.model` at the top, so those
import it where they run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from slide_ir.specs.model import SUPPORTED_MODEL_TYPES, ModelSpec


class ModelConfigError(ValueError):
    """A config.json that cannot be read as a supported model; the message names file and field."""


def _get(config: Mapping[str, Any], key: str, kind: type, origin: str, default: Any = None) -> Any:
    """`config[key]` checked against `kind`; ModelConfigError naming file and field otherwise."""
    if key not in config or config[key] is None:
        if default is None:
            raise ModelConfigError(f"{origin}: missing field {key!r}")
        return default
    value = config[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise ModelConfigError(f"{origin}: field {key!r} must be {kind.__name__}; got {value!r}")
    return float(value) if kind is float else value


def _rope(config: Mapping[str, Any], origin: str) -> tuple[float, str]:
    """(theta, type) from v4 keys (rope_theta, rope_scaling) or v5's rope_parameters."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ModelConfigError(f"{origin}: field 'rope_scaling' must be an object; got {params!r}")
    theta = _get({**params, **config}, "rope_theta", float, origin, 10000.0)
    return theta, str(params.get("rope_type", params.get("type", "default")))


def _sliding_window(config: Mapping[str, Any], model_type: str, origin: str) -> int | None:
    """Mistral windows every layer; qwen2/3 would window only some layers, which we refuse."""
    if model_type == "mistral":
        return _get(config, "sliding_window", int, origin, 0) or None
    if model_type in ("qwen2", "qwen3") and config.get("use_sliding_window"):
        raise ModelConfigError(
            f"{origin}: field 'use_sliding_window' is true; per-layer sliding-window attention "
            "is not supported (all layers must be identical)"
        )
    return None


def spec_from_config(config: Mapping[str, Any], *, name: str, origin: str) -> ModelSpec:
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{origin}: expected a JSON object; got {type(config).__name__}")
    model_type = _get(config, "model_type", str, origin)
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        raise ModelConfigError(
            f"{origin}: field 'model_type' is {model_type!r}; supported: {supported}"
        )
    hidden = _get(config, "hidden_size", int, origin)
    heads = _get(config, "num_attention_heads", int, origin)
    theta, rope_type = _rope(config, origin)
    bias = _get(config, "attention_bias", bool, origin, False)
    try:
        return ModelSpec(
            name=name,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=_get(config, "intermediate_size", int, origin),
            num_layers=_get(config, "num_hidden_layers", int, origin),
            num_heads=heads,
            num_kv_heads=_get(config, "num_key_value_heads", int, origin, heads),
            head_dim=_get(config, "head_dim", int, origin, max(hidden // max(heads, 1), 1)),
            vocab_size=_get(config, "vocab_size", int, origin),
            tied_embeddings=_get(config, "tie_word_embeddings", bool, origin, False),
            qk_norm=model_type == "qwen3",
            attention_bias=model_type == "qwen2" or (bias and model_type != "mistral"),
            o_proj_bias=bias and model_type in ("llama", "qwen3"),
            mlp_bias=model_type == "llama" and _get(config, "mlp_bias", bool, origin, False),
            rms_norm_eps=_get(config, "rms_norm_eps", float, origin, 1e-6),
            rope_theta=theta,
            rope_type=rope_type,
            max_position_embeddings=_get(config, "max_position_embeddings", int, origin, 4096),
            sliding_window=_sliding_window(config, model_type, origin),
            hidden_act=_get(config, "hidden_act", str, origin, "silu"),
            source=str(config.get("_source", config.get("_name_or_path", ""))),
            hf_config_json=json.dumps(dict(config), sort_keys=True),
        )
    except ValueError as e:  # a field out of range: name the file too
        raise ModelConfigError(f"{origin}: {e}") from e


# HF key -> ModelSpec attribute, for configs synthesised from hand-built specs.
_HF_KEYS = (
    ("model_type", "model_type"),
    ("hidden_size", "hidden_size"),
    ("intermediate_size", "intermediate_size"),
    ("num_hidden_layers", "num_layers"),
    ("num_attention_heads", "num_heads"),
    ("num_key_value_heads", "num_kv_heads"),
    ("head_dim", "head_dim"),
    ("vocab_size", "vocab_size"),
    ("tie_word_embeddings", "tied_embeddings"),
    ("rms_norm_eps", "rms_norm_eps"),
    ("rope_theta", "rope_theta"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("hidden_act", "hidden_act"),
)


def synth_hf_config(spec: ModelSpec) -> dict[str, Any]:
    """A minimal HF config equivalent to a hand-built spec (for tiny test models)."""
    config = {key: getattr(spec, attr) for key, attr in _HF_KEYS}
    if spec.model_type in ("llama", "qwen3"):
        config["attention_bias"] = spec.o_proj_bias
    if spec.model_type == "llama":
        config["mlp_bias"] = spec.mlp_bias
    if spec.model_type == "mistral":
        config["sliding_window"] = spec.sliding_window
    return config
