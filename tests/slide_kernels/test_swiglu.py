"""SwiGLU silu(gate) * up against the float64 reference, CPU interpreter and GPU."""

import pytest
import torch
from kernel_checks import assert_bf16_rule, assert_close_fp32, leaf

from slide_kernels import reference, swiglu


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
