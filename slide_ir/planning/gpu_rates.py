"""A GEMM's and an attention kernel's rate at its shape: a derived curve, corrected by a grid.

A profile's `bf16_matmul_tflops` and `attention_tflops` are each one number, measured (or
quoted) at one shape: the probe's reference shapes below. Real kernels run slower at small and
ragged shapes, so each rate is that number scaled by an efficiency of the shape relative to the
reference's:

    rate(shape) = rate_ref x eff(shape) / eff(reference shapes)

**GEMM** (m, n, k): cuBLAS picks a tile per shape; the curve takes the best of three output
tiles (128x256, 128x128, 64x128 at 1.0, 0.95 and 0.85 of the large tile's throughput),

    eff = tile x (m n / padded m n) x (tiles / (ceil(tiles / SMs) x SMs)) x k / (k + 128)

padding to whole tiles (tile quantisation), the last wave's idle SMs (wave quantisation), and
the K loop's prologue and epilogue (about one 128-deep K step). No SM count: no wave term. A
GEMM also takes at least its bytes at HBM bandwidth.

**Attention** (batch, heads, seq, head dim, window): FlashAttention computes 128 x 128 blocks
of (query, key) pairs; a causal mask leaves a triangle of them, so

    eff = (model pairs / computed pairs) x min(1, CTAs / SMs) x head_dim / (head_dim + 64)

the diagonal blocks' waste (model pairs: s^2 / 2, or s w - w^2 / 2 with a window), idle SMs
when batch x heads x seq / 128 CTAs do not fill the GPU, and a narrower head's lower arithmetic
intensity (an estimate: FA2/FA3 run hd 64 at ~0.75 of hd 128's rate, arXiv 2407.08608).

These are the curves of an uncalibrated machine (a preset). `slide calibrate` and `--machine
auto` measure a grid of shapes (`GEMM_GRID`, `ATTENTION_GRID`, covering the catalog's layers
and the batches and sequences users run); the profile stores each point's measured rate, and
a shape's rate is the curve's times the measured/curve ratio interpolated over the grid
(inverse-distance weights in log2 of the dimensions, from the 4 nearest points: exact at a grid
point, the curve's shape between and beyond them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from slide_ir.ir.graph import Attention, Gemm
from slide_ir.planning.shapes import backward_gemms, forward_gemms
from slide_ir.specs.hardware_parts import parse_grid

# The probes' reference shapes (`slide.calibration.gpu_probes`): llama-3.1-8b's layer linears
# over 8192 tokens, forward and both backward products; causal SDPA at (4, 32, 2048, 128); the
# fused loss over 8192 tokens at its hidden size and vocabulary, in chunks of 1024.
REF_TOKENS = 8192
REF_LAYER = (4096, 14336, 4096, 1024)  # (hidden, intermediate, q dim, kv dim)
REF_ATTENTION = Attention(batch=4, heads=32, seq=2048, head_dim=128)
REF_LCE = {"tokens": 8192, "hidden": 4096, "vocab": 128256, "chunk": 1024}

# The grids the probes measure. GEMMs: the layers of five catalog families' sizes (hidden 896 to
# 5120: qwen2.5-0.5b, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen2.5-14b) over 1024, 4096 and
# 16384 tokens, and the fused loss's chunk GEMMs at two vocabularies; attention: causal SDPA over
# 16384 tokens at sequence 512-8192, head dims 64 and 128, and two single-sequence shapes.
GRID_LAYERS = (
    (896, 4864, 896, 128),
    (2048, 8192, 2048, 512),
    (3072, 8192, 3072, 1024),
    (4096, 14336, 4096, 1024),
    (5120, 13824, 5120, 1024),
)  # (H, I, q, kv); fmt: skip
GRID_TOKENS = (1024, 4096, 16384)
GRID_LOSS = ((896, 151936), (2048, 128256), (4096, 151936))  # (H, V), chunks of 2048 tokens
ATTENTION_GRID = (
    *(Attention(batch=16384 // s, heads=2048 // d, seq=s, head_dim=d)
      for d in (64, 128) for s in (512, 1024, 2048, 4096, 8192)),
    Attention(batch=1, heads=24, seq=1024, head_dim=128),
    Attention(batch=1, heads=14, seq=4096, head_dim=64),
)  # fmt: skip

_TILES = ((128, 256, 1.0), (128, 128, 0.95), (64, 128, 0.85))  # (tile m, tile n, throughput)
_K_STEP = 128
_BLOCK = 128  # FlashAttention's query and key block
_NEAREST = 4


def reference_gemms() -> tuple[Gemm, ...]:
    """The matmul probe's GEMMs: llama-3.1-8b's layer over `REF_TOKENS`."""
    return layer_gemms(*REF_LAYER, REF_TOKENS)


def layer_gemms(h: int, i: int, q: int, kv: int, tokens: int) -> tuple[Gemm, ...]:
    """A decoder layer's forward GEMMs and both backward products of each."""
    forward = forward_gemms(h, i, q, kv, tokens)
    return forward + backward_gemms(forward)


def gemm_grid() -> tuple[Gemm, ...]:
    """The GEMM shapes the probes measure (`GRID_LAYERS`, `GRID_TOKENS`, `GRID_LOSS`)."""
    gemms = [g for dims in GRID_LAYERS for t in GRID_TOKENS for g in layer_gemms(*dims, t)]
    for h, v in GRID_LOSS:
        gemms += [Gemm(m=2048, n=v, k=h), Gemm(m=2048, n=h, k=v), Gemm(m=v, n=h, k=2048)]
    return tuple(dict.fromkeys(gemms))


def gemm_efficiency(g: Gemm, sms: int | None) -> float:
    """The derived curve's efficiency of one GEMM (module docstring), in (0, 1]."""
    best = 0.0
    for tm, tn, throughput in _TILES:
        rows, cols = -(-g.m // tm), -(-g.n // tn)
        fill = g.m * g.n / (rows * tm * cols * tn)
        tiles = rows * cols
        waves = 1.0 if sms is None else tiles / (-(-tiles // sms) * sms)
        best = max(best, throughput * fill * waves)
    return best * g.k / (g.k + _K_STEP)


def attention_efficiency(a: Attention, sms: int | None) -> float:
    """The derived curve's efficiency of one attention shape (module docstring), in (0, 1]."""
    blocks = -(-a.seq // _BLOCK)
    span = blocks if not a.window else min(blocks, -(-a.window // _BLOCK) + 1)
    computed = sum(min(i, span) for i in range(1, blocks + 1)) * _BLOCK * _BLOCK
    s, w = a.seq, a.window
    pairs = s * s / 2 if not w or w >= s else s * w - w * w / 2
    if a.masked:  # an explicit mask: every block computed, the causal pairs still the work
        computed = blocks * blocks * _BLOCK * _BLOCK
    ctas = a.batch * a.heads * blocks
    occupancy = 1.0 if sms is None else min(1.0, ctas / sms)
    return min(1.0, pairs / computed) * occupancy * a.head_dim / (a.head_dim + 64)


def attention_dims(a: Attention) -> tuple[int, ...]:
    """The grid coordinates of an attention shape: (batch, heads, seq, head dim)."""
    return (a.batch, a.heads, a.seq, a.head_dim)


@dataclass(frozen=True, slots=True)
class Correction:
    """measured / curve at each grid point, interpolated in log2 of the dimensions."""

    points: tuple[tuple[tuple[float, ...], float], ...]  # (log2 dims, log ratio)

    @classmethod
    def fit(cls, ratios: Iterable[tuple[Sequence[int], float]]) -> Correction:
        return cls(tuple((tuple(math.log2(d) for d in dims), math.log(r)) for dims, r in ratios))

    def at(self, dims: Sequence[int]) -> float:
        if not self.points:
            return 1.0
        here = [math.log2(d) for d in dims]
        near = sorted((math.dist(here, p), value) for p, value in self.points)[:_NEAREST]
        if near[0][0] < 1e-9:
            return math.exp(near[0][1])
        weights = [1 / d**2 for d, _ in near]
        return math.exp(sum(w * v for w, (_, v) in zip(weights, near, strict=True)) / sum(weights))


class ShapeRates:
    """Seconds of a GEMM and FLOP/s of an attention shape, for one GPU profile."""

    __slots__ = ("_attention_ref", "_gemm_memo", "_gemm_ref", "attention_fix", "gemm_fix",
                 "hbm", "masked_fix", "sms")  # fmt: skip

    def __init__(self, gpu: object, *, matmul: float, attention: float, hbm: float) -> None:
        self.sms: int | None = getattr(gpu, "sm_count", None)
        self.hbm = hbm
        ref = reference_gemms()
        # rate_ref / eff(reference): the flop-weighted time of the reference GEMMs
        mean_eff = sum(g.flops for g in ref) / sum(
            g.flops / gemm_efficiency(g, self.sms) for g in ref
        )
        self._gemm_ref = matmul / mean_eff
        self._attention_ref = attention / attention_efficiency(REF_ATTENTION, self.sms)
        self._gemm_memo: dict[Gemm, float] = {}
        self.gemm_fix = Correction.fit(
            (dims, rate * 1e12 / self._curve(_gemm_at(dims)))
            for dims, rate in parse_grid(getattr(gpu, "gemm_grid", None))
        )
        self.attention_fix = Correction.fit(
            (dims, rate * 1e12 / self._attention_curve(_attention_at(dims)))
            for dims, rate in parse_grid(getattr(gpu, "attention_grid", None))
        )
        # masked attention (packed documents): measured at REF_ATTENTION's shape where the
        # profile has it, against the causal rate there; else the causal kernel's curve
        masked = getattr(gpu, "masked_attention_tflops", None)
        ref_masked = replace(REF_ATTENTION, masked=True)
        self.masked_fix = (
            1.0
            if masked is None
            else masked
            * 1e12
            / (
                self._attention_curve(ref_masked)
                * self.attention_fix.at(attention_dims(REF_ATTENTION))
            )
        )

    def _curve(self, g: Gemm) -> float:
        return self._gemm_ref * gemm_efficiency(g, self.sms)

    def _attention_curve(self, a: Attention) -> float:
        return self._attention_ref * attention_efficiency(a, self.sms)

    def gemm_flops_per_s(self, g: Gemm) -> float:
        return self._curve(g) * self.gemm_fix.at((g.m, g.n, g.k))

    def gemm_seconds(self, g: Gemm) -> float:
        seconds = self._gemm_memo.get(g)
        if seconds is None:
            seconds = max(g.flops / self.gemm_flops_per_s(g), g.bytes / self.hbm)
            self._gemm_memo[g] = seconds
        return seconds

    def attention_flops_per_s(self, a: Attention) -> float:
        rate = self._attention_curve(a) * self.attention_fix.at(attention_dims(a))
        return rate * self.masked_fix if a.masked else rate


def _gemm_at(dims: Sequence[int]) -> Gemm:
    if len(dims) != 3:
        raise ValueError(f"a GEMM grid point has 3 dims (m x n x k), got {dims}")
    return Gemm(m=dims[0], n=dims[1], k=dims[2])


def _attention_at(dims: Sequence[int]) -> Attention:
    if len(dims) != 4:
        raise ValueError(
            f"an attention grid point has 4 dims (batch x heads x seq x head_dim), got {dims}"
        )
    b, h, s, d = dims
    return Attention(batch=b, heads=h, seq=s, head_dim=d)
