"""The host side at its size: a copy's, a drive request's and a host AdamW's time from how big it is.

A profile's link, drive and host-update figures are each one rate, measured (or quoted) for large
operations: 256 MiB-1 GiB copies, 128 MiB drive transfers, whole decoder layers. Small operations
are slower per byte, because each pays a fixed cost before its bytes move. Each curve here is
that fixed cost plus its size at the profile's rate (the latency-bandwidth form):

    seconds(size) = fixed + size / rate

- **copies** over the link (`h2d`/`d2h` ops), size in bytes, rate the link's duplex figure (as
  `cost` prices every transfer), fixed `COPY_LATENCY_S`: a pinned `cudaMemcpyAsync` costs ~10 us
  before its first byte, so it reaches 88% of a 55 GB/s link only at 4 MiB and 36 GB/s at 1 MiB
  (NVIDIA's bandwidthTest curves: full PCIe rate only above a few MB);
- **drive requests** (`nvme_read`/`nvme_write`), size in bytes, rate the drive's read or write
  figure (datasheets quote large sequential requests), fixed `NVME_REQUEST_S`: data-centre NVMe
  datasheets give 70-100 us for a 4 KiB read at queue depth 1 (e.g. Samsung PM9A3: 90 us). The
  size is the op's whole region: the nvme lane issues each op as one request and waits for it
  (`executor.nvme`: one `pread`/`pwrite`, or one kvikio call, per op), so the queue depth is one;
- **the host AdamW** (`adam`), size in elements, rate `Cpu.adam_elems_per_s` at the threads the
  plan runs with (per-core rate x threads, capped by DRAM bandwidth), fixed `ADAM_CALL_S`: the
  update's call and its OpenMP thread pool's fork and join over each of the unit's decay ranges
  (an estimate, 20-50 us: no measurement recorded yet; `bench/speed/host_curves.py` takes one).

These are the curves of an uncalibrated machine (a preset). `slide calibrate` and `--machine
auto` measure each at a few sizes (`Link.h2d_grid`, `d2h_grid`; `Nvme.read_grid`, `write_grid`;
`Cpu.adam_grid`, at two thread counts), the profile's large-operation figure among them; the
profile stores each point's measured rate, and an operation's time is the curve's times the
measured / curve time ratio, interpolated linearly in log2 of the size between the points and
held at the nearest end beyond them (`LogLinear`: exact at every point; the fixed cost and the
rate's time keep their shares of it, so `fixed_seconds` stays what no rate scales). A copy's
correction comes from the lone copies of its direction and applies to the duplex rate; an
update's is interpolated the same way in log2 of the thread count, between the two measured
counts nearest the plan's (a rank's threads under data parallel).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slide_ir.specs.hardware_parts import format_grid, parse_grid

COPY_LATENCY_S = 10e-6
NVME_REQUEST_S = 90e-6
ADAM_CALL_S = 30e-6
GRID_UNIT = 1e9  # host grids' rates are in G per second: GB/s, Gelem/s

Dims = tuple[int, ...]


class LogLinear:
    """A function of a grid's dims from its values at its points (one at least): linear in log2
    of each dim between points, held at the ends; the last dim outermost (its groups of points
    alike in it are each interpolated in the dims before it first). Held ends, not the
    GPU grids' inverse-distance weights (`gpu_rates.Correction`): a size far past the largest
    point must take that point's value, not a blend with the small sizes' latency-bound ones."""

    __slots__ = ("points",)

    def __init__(self, points: Iterable[tuple[Sequence[int], float]]) -> None:
        self.points = tuple((tuple(math.log2(d) for d in dims), v) for dims, v in points)

    def at(self, dims: Sequence[int]) -> float:
        return _interpolate(self.points, tuple(math.log2(d) for d in dims))


def _interpolate(
    points: Sequence[tuple[tuple[float, ...], float]], here: tuple[float, ...]
) -> float:
    if not here:
        return sum(v for _, v in points) / len(points)  # one point, or repeats of it
    groups: dict[float, list[tuple[tuple[float, ...], float]]] = {}
    for p, v in points:
        groups.setdefault(p[-1], []).append((p[:-1], v))
    line = sorted((x, _interpolate(group, here[:-1])) for x, group in groups.items())
    x = here[-1]
    if x <= line[0][0]:
        return line[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(line):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return line[-1][1]


@dataclass(frozen=True, slots=True)
class GridField:
    """A part's grid field (`Link.h2d_grid`, ...): its curve's fixed cost, its points' dims, and
    the profile's own rate at a point's dims (the curve each measured point is set against)."""

    fixed_s: float
    dims: int
    own_rate: Callable[[Any, Dims], float]  # (part, dims) -> units per second


GRID_FIELDS: Mapping[str, GridField] = {
    "h2d_grid": GridField(COPY_LATENCY_S, 1, lambda link, _: link.h2d_bytes_per_s),
    "d2h_grid": GridField(COPY_LATENCY_S, 1, lambda link, _: link.d2h_bytes_per_s),
    "read_grid": GridField(NVME_REQUEST_S, 1, lambda drive, _: drive.read_bytes_per_s),
    "write_grid": GridField(NVME_REQUEST_S, 1, lambda drive, _: drive.write_bytes_per_s),
    # lone (no DMA beside it), 28 B/element: as `slide calibrate` measures the update
    "adam_grid": GridField(ADAM_CALL_S, 2, lambda cpu, d: cpu.adam_elems_per_s(threads=d[1])),
}


def _measured(part: Any, name: str) -> list[tuple[Dims, float, float]]:
    """(dims, measured seconds, measured / curve time) at each point of `part`'s grid `name`."""
    spec = GRID_FIELDS[name]
    points = []
    for d, rate in parse_grid(getattr(part, name, None), dims=spec.dims):
        seconds = d[0] / (rate * GRID_UNIT)
        points.append((d, seconds, seconds / (spec.fixed_s + d[0] / spec.own_rate(part, d))))
    return points


class SizeCurve:
    """`fixed_s` + size / rate, times the measured / curve time ratio at the size, from the grid
    `name` of `part` (module docstring); `seconds` takes the rate the op runs at (efficiencies,
    shares and DMA load applied). dims[0] is the size; a size of 0 costs nothing."""

    __slots__ = ("_memo", "fix", "fixed_s")

    def __init__(self, part: Any, name: str) -> None:
        self.fixed_s = GRID_FIELDS[name].fixed_s
        self.fix = LogLinear((d, math.log(ratio)) for d, _, ratio in _measured(part, name))
        self._memo: dict[Dims, float] = {}

    def factor(self, dims: Dims) -> float:
        """measured / curve time at `dims` (1 without a grid)."""
        factor = self._memo.get(dims)
        if factor is None:
            factor = self._memo[dims] = math.exp(self.fix.at(dims)) if self.fix.points else 1.0
        return factor

    def seconds(self, dims: Dims, rate: float) -> float:
        return 0.0 if not dims[0] else self.factor(dims) * (self.fixed_s + dims[0] / rate)

    def fixed_seconds(self, dims: Dims) -> float:
        return 0.0 if not dims[0] else self.factor(dims) * self.fixed_s


def refit_grid(part: Any, name: str, factor: float) -> str:
    """`part`'s grid `name` as a re-fit that divides the part's rates by `factor` moves it: each
    point's rate part `factor` times longer, its fixed cost's share as it was (what
    `SizeCurve.fixed_seconds` says no rate scales). Every op on the curve then takes its fixed
    part + `factor` x the rest, as on a profile without the grid."""
    fixed_s = GRID_FIELDS[name].fixed_s
    points = []
    for d, seconds, ratio in _measured(part, name):
        fixed = ratio * fixed_s
        points.append((d, d[0] / (fixed + factor * (seconds - fixed)) / GRID_UNIT))
    return format_grid(points)


class HostCurves:
    """One machine's host-side curves: copies each way, each drive's reads and writes, and the
    host AdamW at `threads` (a rank's update threads; the host update's grid dims are
    (elements, threads))."""

    __slots__ = ("adam", "d2h", "h2d", "reads", "threads", "writes")

    def __init__(self, machine: Any, threads: int) -> None:
        link, drives = machine.link, tuple(getattr(machine, "nvme", ()) or ())
        self.threads = threads
        self.h2d, self.d2h = SizeCurve(link, "h2d_grid"), SizeCurve(link, "d2h_grid")
        self.reads = tuple(SizeCurve(d, "read_grid") for d in drives)
        self.writes = tuple(SizeCurve(d, "write_grid") for d in drives)
        self.adam = SizeCurve(machine.cpu, "adam_grid")

    def adam_dims(self, elements: int) -> Dims:
        return (elements, self.threads)
