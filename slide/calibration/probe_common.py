"""What every calibration probe shares: its result types and its clocks.

A probe returns a `Figure` (one rate in base units with a note of how it was measured) or a
`GridFigure` (a curve in a grid field's text form). GPU work is timed with CUDA events after
warm-up (`cuda_median`), CPU work with the host clock (`host_median`); both take the median of
repeats. `WholeBuffer` is the one-range layout both AdamW probes (device and host) update.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from slide_ir.specs.hardware_parts import format_grid

MB = 1 << 20


@dataclass(frozen=True)
class Figure:
    value: float
    note: str
    threads: int = 0  # CPU probes: the intra-op threads they ran with
    elements: int = 0  # the host-update probe: its unit's elements


@dataclass(frozen=True)
class GridFigure:
    text: str  # a grid field's form (`Gpu.gemm_grid`, `Link.h2d_grid`, ...)
    note: str
    points: int


def size_grid(seconds: Mapping[int, float], note: str) -> GridFigure:
    """A host curve's grid (`Link.h2d_grid`, `Nvme.read_grid`) from the seconds of an operation
    of each size: its rate there in GB/s."""
    points = [((b,), b / t / 1e9) for b, t in sorted(seconds.items())]
    return GridFigure(format_grid(points), note, len(points))


def cuda_median(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Seconds per call: CUDA events around each call, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def host_median(fn: Callable[[], object], repeats: int = 5) -> float:
    """Seconds per call: the host clock around each call, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class WholeBuffer:
    """One weight-decayed range over the whole buffer: all `update_host` asks of a layout."""

    def __init__(self, n: int) -> None:
        self.n = n

    def decay_ranges(self) -> tuple[tuple[int, int, bool], ...]:
        return ((0, self.n, True),)
