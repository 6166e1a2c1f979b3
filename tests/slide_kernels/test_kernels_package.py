"""`slide_kernels` is our package, transformers works beside it, and the ops match transformers' layers.

A PyPI distribution is called `kernels` (transformers >= 5.25 depends on it and imports it at model
load): our package must be the one `slide_kernels` imports, and must never be what `kernels` finds.
"""

import importlib.util
from pathlib import Path

import torch
from kernel_checks import assert_close_fp32

import slide_kernels

REPO = Path(__file__).resolve().parents[2]


def test_import_slide_kernels_is_ours():
    assert Path(slide_kernels.__file__).resolve().is_relative_to(REPO)
    assert callable(slide_kernels.fused_linear_cross_entropy) and callable(
        slide_kernels.rope_cos_sin
    )


def test_the_name_kernels_is_not_ours():
    """A top-level package of ours is REPO/<name>/__init__.py: `kernels` must resolve elsewhere."""
    spec = importlib.util.find_spec("kernels")
    assert spec is None or Path(spec.origin or "").resolve().parent.parent != REPO


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=67,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_tiny_llama_builds_and_runs_beside_our_kernels():
    model = _tiny_llama()
    ids = torch.randint(0, 67, (2, 9))
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, 9, 67) and torch.isfinite(out.loss)


def test_ops_match_the_llama_layers():
    """RMSNorm, MLP activation, RoPE and the loss, each against the layer it replaces."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = _tiny_llama()
    layer = model.model.layers[0]
    ids = torch.randint(0, 67, (2, 9))
    labels = ids.clone()
    labels[0, :3] = -100
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        norm = layer.input_layernorm
        assert_close_fp32(
            slide_kernels.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x), "rms_norm"
        )
        gate, up = layer.mlp.gate_proj(x), layer.mlp.up_proj(x)
        assert_close_fp32(slide_kernels.swiglu(gate, up), layer.mlp.act_fn(gate) * up, "swiglu")
        positions = torch.arange(9).expand(2, 9)
        cos, sin = model.model.rotary_emb(x, positions)
        q, k = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8)
        ours, theirs = slide_kernels.rope(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)
        for a, b in zip(ours, theirs, strict=True):
            assert_close_fp32(a, b, "rope")
        out = model(ids, labels=labels, output_hidden_states=True)
        hidden = out.hidden_states[-1][:, :-1].reshape(-1, 32)  # HF shifts labels by one
        loss = slide_kernels.fused_linear_cross_entropy(
            hidden, model.lm_head.weight, labels[:, 1:].reshape(-1)
        )
        assert_close_fp32(loss, out.loss, "lce")
