"""SwiGLU silu(gate) * up against the float64 reference, CPU interpreter and GPU."""

import pytest
import torch
from kernel_checks import assert_bf16_rule, assert_close_fp32, leaf

from slide_kernels import reference, swiglu, swiglu_gate_up, swiglu_gate_up_backward


def _run(fn, gate, up, upstream, dtype):
    gate = leaf(gate, dtype)
    up = leaf(up, dtype)
    y = fn(gate, up)
    y.backward(upstream.to(y.device, dtype))
    return y.detach(), gate.grad, up.grad


@pytest.mark.parametrize("shape", [(3, 7, 41), (5000,), (2, 1, 2049)])
def test_swiglu_matches_fp64_reference(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    gate, up, upstream = (torch.randn(shape, generator=gen) * 4 for _ in range(3))
    got = _run(swiglu, gate, up, upstream, torch.float32)
    gold = _run(reference.swiglu, gate, up, upstream, torch.float64)
    for a, b in zip(got, gold, strict=True):
        assert_close_fp32(a, b, "swiglu")


def test_swiglu_non_contiguous_inputs():
    """gate and up as the two halves of one fused projection: strided views, not copies."""
    gen = torch.Generator().manual_seed(5)
    fused, upstream = torch.randn(6, 2 * 19, generator=gen), torch.randn(6, 19, generator=gen)
    results = []
    for fn, dtype in [(swiglu, torch.float32), (reference.swiglu, torch.float64)]:
        parent = leaf(fused, dtype)
        y = fn(parent[:, :19], parent[:, 19:])
        y.backward(upstream.to(y.device, dtype))
        results.append((y.detach(), parent.grad))
    for a, b in zip(*results, strict=True):
        assert_close_fp32(a, b, "swiglu")


@pytest.mark.parametrize("shape", [(3, 7, 2 * 41), (2, 1, 2 * 2049), (4, 2 * 5)])
def test_swiglu_gate_up_reads_the_packed_projection(shape):
    """The fused gate|up output whole: the product, and one (..., 2I) gradient from autograd
    and from `swiglu_gate_up_backward` alike, against the float64 reference."""
    gen = torch.Generator().manual_seed(sum(shape))
    packed = torch.randn(shape, generator=gen) * 4
    upstream = torch.randn(*shape[:-1], shape[-1] // 2, generator=gen)
    results = []
    for fn, dtype in [(swiglu_gate_up, torch.float32), (reference.swiglu_gate_up, torch.float64)]:
        parent = leaf(packed, dtype)
        y = fn(parent)
        y.backward(upstream.to(y.device, dtype))
        results.append((y.detach(), parent.grad))
    (y, grad), (gold_y, gold_grad) = results
    assert_close_fp32(y, gold_y, "swiglu")
    assert_close_fp32(grad, gold_grad, "swiglu")
    direct = swiglu_gate_up_backward(packed.to(y.device), upstream.to(y.device))
    assert torch.equal(direct, grad)


def test_swiglu_gate_up_rejects_an_odd_last_dim():
    with pytest.raises(ValueError, match="even"):
        swiglu_gate_up(torch.randn(2, 7))


def test_swiglu_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="match"):
        swiglu(torch.randn(2, 3), torch.randn(3, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16, 1024, 14336), (3, 77, 1001)])
def test_swiglu_bf16_gpu_within_twice_torch_error(shape):
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate, up, upstream = (torch.randn(shape, device="cuda", generator=gen) for _ in range(3))
    gold = _run(reference.swiglu, gate, up, upstream, torch.float32)
    eager = _run(reference.swiglu, gate, up, upstream, torch.bfloat16)
    got = _run(swiglu, gate, up, upstream, torch.bfloat16)
    for what, k, t, g in zip(["y", "dgate", "dup"], got, eager, gold, strict=True):
        assert_bf16_rule(k, t, g, f"swiglu {what}")
