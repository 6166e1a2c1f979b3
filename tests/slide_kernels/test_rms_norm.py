"""RMSNorm (Llama/Qwen convention) against the float64 reference, CPU interpreter and GPU."""

import importlib

import pytest
import torch
from kernel_checks import DEVICE, assert_bf16_rule, assert_close_fp32, leaf

from slide_kernels import reference, rms_norm


def _run(fn, x, w, eps, upstream, dtype):
    x = leaf(x, dtype)
    w = leaf(w, dtype)
    y = fn(x, w, eps)
    y.backward(upstream.to(y.device, y.dtype))
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize(
    "shape",
    [
        (3, 7, 41),  # awkward everything
        (2, 3, 5, 16),  # Qwen3 q/k norm: (batch, heads, seq, head_dim), many short rows
        (1, 300),  # one long-ish row block, N not a power of two
        (257, 9),  # many short rows in one tile
    ],
)
def test_rms_norm_matches_fp64_reference(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen) * 3
    w = torch.rand(shape[-1], generator=gen) + 0.5
    upstream = torch.randn(shape, generator=gen)
    got = _run(rms_norm, x, w, 1e-6, upstream, torch.float32)
    gold = _run(reference.rms_norm, x, w, 1e-6, upstream, torch.float64)
    for a, b in zip(got, gold, strict=True):
        assert_close_fp32(a, b, "rms_norm")


@pytest.mark.parametrize("tile", [32, 128])
def test_rms_norm_small_tiles_split_rows_over_programs(monkeypatch, tile):
    """Tiles of 2 or 8 rows: 129 or 33 row blocks over the interpreter's 4 backward programs,
    a run of blocks each, the last run and the last block ragged."""
    rn = importlib.import_module(
        "slide_kernels.rms_norm"
    )  # the module: `slide_kernels` exports the function
    monkeypatch.setattr(rn, "TILE", tile)
    monkeypatch.setattr(rn, "BWD_TILE", tile)
    gen = torch.Generator().manual_seed(tile)
    x, w = torch.randn(257, 9, generator=gen), torch.rand(9, generator=gen) + 0.5
    upstream = torch.randn(257, 9, generator=gen)
    got = _run(rms_norm, x, w, 1e-6, upstream, torch.float32)
    gold = _run(reference.rms_norm, x, w, 1e-6, upstream, torch.float64)
    for a, b in zip(got, gold, strict=True):
        assert_close_fp32(a, b, "rms_norm")


@pytest.mark.parametrize("int32_below", [2**31, 0])
@pytest.mark.parametrize("rows", [256, 257])
def test_rms_norm_forward_address_paths(monkeypatch, int32_below, rows):
    """The forward's int32 and int64 offsets, with tiles of 2 rows that fill the rows exactly
    (no row mask) or leave the last one half empty."""
    rn = importlib.import_module("slide_kernels.rms_norm")
    monkeypatch.setattr(rn, "INT32_OFFSETS_BELOW", int32_below)
    monkeypatch.setattr(rn, "TILE", 32)
    gen = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 9, generator=gen), torch.rand(9, generator=gen) + 0.5
    y, rstd = rn.rms_norm_forward(x.to(DEVICE), w.to(DEVICE), 1e-6)  # the kernel itself, no wrapper
    assert_close_fp32(y.cpu(), reference.rms_norm(x.double(), w.double(), 1e-6), "rms_norm")
    assert_close_fp32(rstd.cpu(), torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6), "rms_norm")


def test_rms_norm_strided_rows_and_large_eps():
    """Rows that are a slice of wider rows (stride 32, not 24), normalised without a copy."""
    gen = torch.Generator().manual_seed(3)
    base, w = torch.randn(5, 3, 32, generator=gen), torch.randn(24, generator=gen)
    upstream = torch.randn(5, 3, 24, generator=gen)
    results = []
    for fn, dtype in [(rms_norm, torch.float32), (reference.rms_norm, torch.float64)]:
        parent, weight = leaf(base, dtype), leaf(w, dtype)
        y = fn(parent[..., :24], weight, 0.5)
        y.backward(upstream.to(y.device, dtype))
        results.append((y.detach(), parent.grad, weight.grad))
    for a, b in zip(*results, strict=True):
        assert_close_fp32(a, b, "rms_norm")


def test_rms_norm_rejects_mismatched_weight():
    with pytest.raises(ValueError, match="weight"):
        rms_norm(torch.randn(2, 8), torch.randn(7), 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16, 1024, 4096), (2, 32, 1024, 128), (3, 77, 5120)])
def test_rms_norm_bf16_gpu_within_twice_torch_error(shape):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", generator=gen)
    w = torch.rand(shape[-1], device="cuda", generator=gen) + 0.5
    upstream = torch.randn(shape, device="cuda", generator=gen)
    gold = _run(reference.rms_norm, x, w, 1e-5, upstream, torch.float32)
    eager = _run(reference.rms_norm, x, w, 1e-5, upstream, torch.bfloat16)
    got = _run(rms_norm, x, w, 1e-5, upstream, torch.bfloat16)
    for what, k, t, g in zip(["y", "dx", "dw"], got, eager, gold, strict=True):
        assert_bf16_rule(k, t, g, f"rms_norm {what}")
