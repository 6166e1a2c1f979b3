"""Our functional layers against transformers' own modules, float32 on CPU: output and every
gradient (input and all parameters) under a random upstream gradient."""

from __future__ import annotations

import pytest
import torch
from hf_models import CONFIGS, flat_units, hf_model, spec_of, state_dict_fp32

from executor import fused, layers
from executor.layout import unit_layouts

B, S = 2, 16  # S > mistral's sliding window (8): the window mask is exercised
TOL = {"rtol": 1e-5, "atol": 1e-5}  # fp32, same ops in the same order: only GEMM blocking differs
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("fuse", [False, True], ids=["per-projection", "fused-gemms"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_decoder_layer_matches_transformers(
    arch: str, fuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both forms of the grouped linears: per projection (CPU default) and one GEMM (CUDA)."""
    monkeypatch.setattr(fused, "FUSE_ON_CPU", fuse)
    config = CONFIGS[arch]
    spec, model = spec_of(config), hf_model(config)
    hf_layer = model.model.layers[1]
    torch.manual_seed(1)
    x = torch.randn(B, S, spec.hidden_size, requires_grad=True)
    grad_out = torch.randn(B, S, spec.hidden_size)
    positions = torch.arange(S)[None]
    cos, sin = model.model.rotary_emb(x, positions)
    mask = None
    if spec.sliding_window is not None and spec.sliding_window < S:
        keep = layers.make_rope(spec, S, x.device, torch.float32).mask
        mask = torch.zeros(S, S).masked_fill(~keep, float("-inf"))[None, None]
    ref = hf_layer(x, attention_mask=mask, position_embeddings=(cos, sin))
    ref_dx, *ref_dp = torch.autograd.grad(ref, [x, *hf_layer.parameters()], grad_out)

    layout = unit_layouts(spec)[2]
    flat = flat_units(spec, state_dict_fp32(model))[2].requires_grad_()
    rope = layers.make_rope(spec, S, x.device, torch.float32)
    x2 = x.detach().clone().requires_grad_()
    out = layers.decoder_layer(x2, layout.views(flat), spec, rope)
    dx, dflat = torch.autograd.grad(out, [x2, flat], grad_out)

    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(dx, ref_dx, **TOL)
    names = [f"model.layers.1.{n}" for n, _ in hf_layer.named_parameters()]
    ours = layout.hf_views(dflat)
    for name, g in zip(names, ref_dp, strict=True):
        torch.testing.assert_close(ours[name], g, **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", sorted(CONFIGS))  # llama: biases on the MLP too
def test_taped_layer_backward_is_the_recorded_layers_bit_for_bit(
    arch: str, dtype: torch.dtype
) -> None:
    """`decoder_layer_taped`'s root (the recompute's, and a kept forward's that writes its
    output) gives the gradients a recorded `decoder_layer` does, bit for bit, and the kept
    forward's output is the layer's; on CUDA too where there is a GPU (Triton kernels)."""
    spec = spec_of(CONFIGS[arch])
    layout = unit_layouts(spec)[1]
    torch.manual_seed(3)
    weights = (torch.randn(layout.numel) * 0.05).to(DEVICE, dtype)
    rope = layers.make_rope(spec, S, torch.device(DEVICE), dtype)
    x0 = torch.randn(B, S, spec.hidden_size).to(DEVICE, dtype)
    grad_out = torch.randn_like(x0)

    def run(form: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = x0.clone().requires_grad_()
        leaves = {k: v.detach().requires_grad_() for k, v in layout.views(weights).items()}
        out = torch.full_like(x0, float("nan"))
        with torch.enable_grad():
            if form == "recorded":
                root = layers.decoder_layer(x, leaves, spec, rope)
                out = root.detach()
            else:
                kept = out if form == "kept" else None
                root = layers.decoder_layer_taped(x, leaves, spec, rope, out=kept)
        torch.autograd.backward(root, grad_out, inputs=[x, *leaves.values()])
        return out, [x.grad, *(leaf.grad for leaf in leaves.values())]

    out, grads = run("recorded")
    for form in ("recomputed", "kept"):
        form_out, form_grads = run(form)
        for ours, ref in zip(form_grads, grads, strict=True):
            assert ours is not None and ref is not None and torch.equal(ours, ref), form
        if form == "kept":
            assert torch.equal(form_out, out)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied and tied heads
def test_model_loss_and_grads_match_transformers(arch: str) -> None:
    """Embedding -> layers -> head loss, chained by hand, equals the HF model's loss."""
    config = CONFIGS[arch]
    spec, model = spec_of(config), hf_model(config)
    torch.manual_seed(2)
    ids = torch.randint(0, spec.vocab_size, (B, S))
    labels = torch.randint(0, spec.vocab_size, (B, S))
    labels[0, :3] = -100
    logits = model(input_ids=ids).logits
    valid = int((labels != -100).sum())
    ref = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    ref_grads = dict(
        zip(
            dict(model.named_parameters()),
            torch.autograd.grad(ref, list(model.parameters())),
            strict=True,
        )
    )

    lay = unit_layouts(spec)
    flats = {u: f.requires_grad_() for u, f in flat_units(spec, state_dict_fp32(model)).items()}
    rope = layers.make_rope(spec, S, ids.device, torch.float32)
    h = lay[0].views(flats[0])["embed.w"][ids]
    for unit in range(1, spec.num_layers + 1):
        h = layers.decoder_layer(h, lay[unit].views(flats[unit]), spec, rope)
    head = lay[spec.num_layers + 1].views(flats[spec.num_layers + 1])
    lm = head["lm.w"] if "lm.w" in head else lay[0].views(flats[0])["embed.w"]
    loss = layers.head_loss(
        h, head["norm"], lm, labels, eps=spec.rms_norm_eps, scale=1.0 / valid, chunk=None
    )
    grads = torch.autograd.grad(loss, list(flats.values()))
    torch.testing.assert_close(loss, ref, **TOL)
    for unit, g in zip(flats, grads, strict=True):
        for name, view in lay[unit].hf_views(g).items():
            want = ref_grads[name] if name in ref_grads else ref_grads["lm_head.weight"]
            torch.testing.assert_close(view, want, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_cpu_embedding_gradient_is_the_same_bits_every_time():
    """Many repeated tokens, two threads: index_put_'s CPU threads added into shared rows in
    varying order (last-bit differences between runs); the gradient is now one fixed sum."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (4, 2048), generator=gen)
    grad_out = torch.randn(4, 2048, 64, generator=gen)

    def grad(threads):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            g = torch.zeros(64, 64)
            layers.embed_backward(ids, grad_out, g, accumulate=False)
            return g
        finally:
            torch.set_num_threads(previous)

    first = grad(2)
    assert all(torch.equal(first, grad(2)) for _ in range(30))
    assert torch.equal(first, grad(1))
    expected = torch.zeros(64, 64, dtype=torch.float64).index_add_(
        0, ids.reshape(-1), grad_out.reshape(-1, 64).double()
    )
    torch.testing.assert_close(first, expected.float(), rtol=1e-5, atol=1e-4)  # fp32 sums of ~128


def test_document_mask_and_tables_of_a_hand_made_batch() -> None:
    """Row 0 packs documents of 3 and 2 tokens and a padding token, row 1 one document of 6;
    with mistral's window of 8 shrunk to 2 the window cuts the longer documents too."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    doc = [[1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0],
           [0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]]  # fmt: skip
    causal = torch.ones(6, 6).tril().bool()
    for arch, window in (("llama", None), ("mistral", 2)):
        spec = spec_of({**CONFIGS[arch], **({"sliding_window": window} if window else {})})
        rope = layers.document_rope(spec, positions, torch.float32)
        near = torch.ones(6, 6).triu(-(window - 1)).bool() if window else torch.ones(6, 6).bool()
        assert rope.mask is not None and rope.mask.shape == (2, 1, 6, 6)
        assert torch.equal(rope.mask[0, 0], causal & near & torch.tensor(doc).bool())
        assert torch.equal(rope.mask[1, 0], causal & near)
        # each token's tables are those of its position in a sequence of its own
        alone = layers.make_rope(spec, 6, positions.device, torch.float32)
        assert torch.equal(rope.cos, alone.cos[positions])
        assert torch.equal(rope.sin, alone.sin[positions])
