"""Pure-torch references for every kernel: the tests' gold, the benchmarks' baseline, the fallback.

Each follows the Hugging Face transformers convention it replaces (LlamaRMSNorm, LlamaMLP's
act(gate) * up, apply_rotary_pos_emb, ForCausalLMLoss's upcast of the logits), and computes in at
least float32: pass float64 inputs to get a float64 gold result.
"""

import torch
import torch.nn.functional as F


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T` against `labels`, materialising all the logits."""
    logits = hidden @ weight.T  # (T, V)
    logits = logits.to(_at_least_fp32(logits.dtype))
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama/Qwen RMSNorm over the last dim: normalise in fp32, cast back, then scale by weight."""
    xf = x.to(_at_least_fp32(x.dtype))
    variance = xf.pow(2).mean(-1, keepdim=True)
    normed = xf * torch.rsqrt(variance + eps)
    return weight * normed.to(x.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, the gated MLP activation of Llama and Qwen."""
    return F.silu(gate) * up


def swiglu_gate_up(gate_up: torch.Tensor) -> torch.Tensor:
    """`swiglu` of a fused projection's output (..., 2I): gate its first half, up its second."""
    gate, up = gate_up.chunk(2, dim=-1)
    return swiglu(gate, up)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF apply_rotary_pos_emb: q, k (batch, heads, seq, head_dim); cos, sin (seq, d) or (b, seq, d)."""
    if cos.dim() == 3:  # (batch, seq, d) -> (batch, 1, seq, d), broadcast over heads
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
