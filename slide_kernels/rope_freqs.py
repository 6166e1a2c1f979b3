"""cos/sin tables for RoPE, computed as transformers does, for the rope types in our catalog.

Pure torch (no Triton): `rope_cos_sin` reproduces `LlamaRotaryEmbedding` bit for bit (same fp32
arithmetic, same order), for `scaling` None / rope_type "default", "linear" and "llama3" (Llama 3.1+).
The `scaling` dict is the config's `rope_scaling` / `rope_parameters`; its `rope_theta`, if any,
is ignored in favour of the `theta` argument.
"""

import math

import torch

ROPE_TYPES = ("default", "linear", "llama3")


def _rope_type(scaling: dict | None) -> str:
    if not scaling:
        return "default"
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope scaling: rope_type must be one of {ROPE_TYPES}, got {rope_type!r}")
    return rope_type


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1 frequency smoothing, as transformers' _compute_llama3_parameters."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """(head_dim // 2,) fp32 inverse frequencies."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
    inv_freq = 1.0 / (theta ** (exponents / head_dim))
    rope_type = _rope_type(scaling)
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling)
    return inv_freq


def rope_cos_sin(
    head_dim: int,
    positions: torch.Tensor,
    theta: float,
    scaling: dict | None = None,
    *,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (*positions.shape, head_dim) in the HF layout (frequencies repeated twice).

    positions: (seq,) or (batch, seq) integer positions, on the device the tables should live on.
    """
    inv_freq = rope_inv_freq(head_dim, theta, scaling, positions.device)
    freqs = positions[..., None].float() * inv_freq  # (..., seq, head_dim // 2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (..., seq, head_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)
