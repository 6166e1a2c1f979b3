"""The rate grids: each GEMM and attention shape of `slide_ir.planning.gpu_rates`' grids, timed.

The profile stores every point's measured TFLOP/s (`Gpu.gemm_grid`, `Gpu.attention_grid`); the
cost model corrects its derived shape curves by them. Each shape is timed with CUDA events, one
warm-up and the median of five calls: the GEMM grid is ~93 TFLOP in all, ~0.15 s a pass on an
H200, so both grids together stay near a second (`--machine auto`'s start-up budget).
"""

from __future__ import annotations

import torch

from slide.calibration.gpu_probes import attention_flops, attention_seconds
from slide.calibration.probe_common import GridFigure, cuda_median
from slide_ir.ir.graph import Gemm
from slide_ir.planning.gpu_rates import ATTENTION_GRID, attention_dims, gemm_grid
from slide_ir.specs.hardware_parts import format_grid


def gemm_seconds(g: Gemm) -> float:
    """One GEMM as the layers run theirs, x (m, k) @ w (n, k)^T, BF16."""
    x = torch.randn(g.m, g.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g.n, g.k, device="cuda", dtype=torch.bfloat16)
    return cuda_median(lambda: x @ w.t(), repeats=5, warmup=1)


def gemm_grid_rates() -> GridFigure:
    points = [((g.m, g.n, g.k), g.flops / gemm_seconds(g) / 1e12) for g in gemm_grid()]
    return GridFigure(format_grid(points), "bf16 x @ w.T at each grid shape", len(points))


def attention_grid_rates() -> GridFigure:
    points = [
        (attention_dims(a), attention_flops(a) / attention_seconds(a, 5, 1) / 1e12)
        for a in ATTENTION_GRID
    ]
    return GridFigure(format_grid(points), "causal SDPA fwd+bwd at each grid shape", len(points))
