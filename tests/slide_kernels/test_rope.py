"""RoPE (HF rotate_half layout) and its cos/sin tables, against float64 and transformers."""

import pytest
import torch
from kernel_checks import DEVICE, assert_bf16_rule, assert_close_fp32, leaf

from slide_kernels import reference, rope, rope_cos_sin

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _qk(batch, n_qh, n_kh, seq, head_dim, gen, device="cpu"):
    """q as HF makes it: a (batch, seq, heads, d) projection viewed as (batch, heads, seq, d)."""
    q = torch.randn(batch, seq, n_qh, head_dim, generator=gen, device=device).transpose(1, 2)
    k = torch.randn(batch, n_kh, seq, head_dim, generator=gen, device=device)
    return q, k


def _run(fn, q, k, cos, sin, dq, dk, dtype):
    q = leaf(q, dtype)
    k = leaf(k, dtype)
    q_out, k_out = fn(q, k, cos.to(q.device, dtype), sin.to(q.device, dtype))
    torch.autograd.backward((q_out, k_out), (dq.to(q.device, dtype), dk.to(q.device, dtype)))
    return q_out.detach(), k_out.detach(), q.grad, k.grad


@pytest.mark.parametrize(
    ("batch", "n_qh", "n_kh", "seq", "head_dim", "cos_batch"),
    [
        (2, 6, 2, 5, 10, None),  # GQA 3:1, cos (seq, d)
        (3, 7, 7, 11, 6, 3),  # MHA, odd head counts, cos per batch (b, seq, d)
        (1, 4, 1, 9, 64, 1),  # MQA, cos (1, seq, d)
    ],
)
def test_rope_matches_fp64_reference(batch, n_qh, n_kh, seq, head_dim, cos_batch):
    gen = torch.Generator().manual_seed(seq * head_dim)
    q, k = _qk(batch, n_qh, n_kh, seq, head_dim, gen)
    positions = torch.randint(0, 4096, (cos_batch or 1, seq), generator=gen)
    cos, sin = rope_cos_sin(head_dim, positions, 10000.0)
    if cos_batch is None:
        cos, sin = cos[0], sin[0]
    dq, dk = torch.randn(q.shape, generator=gen), torch.randn(k.shape, generator=gen)
    got = _run(rope, q, k, cos, sin, dq, dk, torch.float32)
    gold = _run(reference.rope, q, k, cos, sin, dq, dk, torch.float64)
    for a, b in zip(got, gold, strict=True):
        assert_close_fp32(a, b, "rope")


def test_rope_output_keeps_hf_strides():
    gen = torch.Generator().manual_seed(0)
    q, k = (t.to(DEVICE) for t in _qk(2, 4, 2, 3, 8, gen))
    cos, sin = rope_cos_sin(8, torch.arange(3, device=DEVICE), 10000.0)
    q_out, _ = rope(q, k, cos, sin)
    assert q_out.stride() == q.stride()


def test_rope_rejects_bad_shapes():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="cos"):
        rope(q, k, torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="disagree"):
        rope(q, torch.randn(1, 2, 3, 6), torch.randn(3, 8), torch.randn(3, 8))


@pytest.mark.parametrize("scaling", [None, {"rope_type": "default"}, LLAMA3])
def test_cos_sin_equal_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    head_dim, theta = 64, 500000.0
    config = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_parameters={"rope_theta": theta, **(scaling or {"rope_type": "default"})},
    )
    positions = torch.tensor([[0, 1, 7, 8191, 8192, 65000, 131071]])
    cos_hf, sin_hf = LlamaRotaryEmbedding(config)(torch.ones(1, dtype=torch.float32), positions)
    cos, sin = rope_cos_sin(head_dim, positions, theta, scaling)
    assert_close_fp32(cos, cos_hf, "rope_cos_sin")
    assert_close_fp32(sin, sin_hf, "rope_cos_sin")


def test_cos_sin_rejects_unknown_rope_type():
    with pytest.raises(ValueError, match="rope_type"):
        rope_cos_sin(8, torch.arange(4), 10000.0, {"rope_type": "yarn", "factor": 4.0})


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("batch", "n_qh", "n_kh", "seq", "head_dim"), [(16, 32, 8, 1024, 128), (3, 28, 4, 77, 128)]
)
def test_rope_bf16_gpu_within_twice_torch_error(batch, n_qh, n_kh, seq, head_dim):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = _qk(batch, n_qh, n_kh, seq, head_dim, gen, device="cuda")
    positions = torch.arange(seq, device="cuda").expand(batch, seq)
    cos, sin = rope_cos_sin(head_dim, positions, 500000.0, LLAMA3)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    gold = _run(reference.rope, q, k, cos, sin, dq, dk, torch.float32)
    eager = _run(reference.rope, q, k, cos, sin, dq, dk, torch.bfloat16)
    got = _run(rope, q, k, cos, sin, dq, dk, torch.bfloat16)
    for what, a, t, g in zip(["q", "k", "dq", "dk"], got, eager, gold, strict=True):
        assert_bf16_rule(a, t, g, f"rope {what}")
