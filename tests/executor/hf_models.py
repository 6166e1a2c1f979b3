"""Tiny random Hugging Face configs of every supported architecture, and helpers to move
weights between a transformers model and our flat unit buffers (tests only)."""

from __future__ import annotations

import torch

from bench.kernels.gpu_parity import random_model
from executor.layout import UnitLayout, unit_layouts
from slide_ir.specs.model import ModelSpec

_BASE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
}

CONFIGS: dict[str, dict] = {
    "llama": {
        **_BASE,
        "model_type": "llama",
        "attention_bias": True,
        "mlp_bias": True,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "qwen2": {**_BASE, "model_type": "qwen2", "rope_theta": 1000000.0, "tie_word_embeddings": True},
    "qwen3": {**_BASE, "model_type": "qwen3", "head_dim": 32, "rope_theta": 1000000.0},
    "mistral": {**_BASE, "model_type": "mistral", "sliding_window": 8, "num_key_value_heads": 1},
}


def tiny_config(arch: str, **overrides: object) -> dict:
    return {**CONFIGS[arch], **overrides}


def spec_of(config: dict, name: str = "tiny") -> ModelSpec:
    return ModelSpec.from_hf_config(config, name=name)


hf_model = random_model


def state_dict_fp32(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """HF names -> detached fp32 copies (the tied lm_head.weight dropped, as checkpoints do)."""
    sd = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    return sd


def flat_units(spec: ModelSpec, state: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """One flat fp32 buffer per unit, filled from an HF state dict."""
    out = {}
    for unit, layout in unit_layouts(spec).items():
        flat = torch.empty(layout.numel)
        for name, view in layout.hf_views(flat).items():
            view.copy_(state[name])
        out[unit] = flat
    return out


def layout_grads(layout: UnitLayout, named: dict[str, torch.Tensor]) -> torch.Tensor:
    """Flatten HF-named gradients into the unit's flat order."""
    flat = torch.zeros(layout.numel)
    for name, view in layout.hf_views(flat).items():
        view.copy_(named[name])
    return flat
