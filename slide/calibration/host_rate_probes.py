"""Measure the host side's rates the way the executor uses them, for `slide calibrate`.

The link (pinned and pageable copies, their size curves), the executor's host AdamW from a lane
thread (at one unit, under DMA, and its size curve), the FP32 -> BF16 cast, the host's RAM and
the NVMe drive's transfers and request curves. Each probe returns a figure in base units
(bytes/s, elements/s) with a short note of how it was measured; CPU work is timed with the host
clock, copies with CUDA events. The GPU lane's probes are `slide.calibration.gpu_probes`'.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from executor.adam import AdamWConfig, HostScratch, Part, StepHp, update_host
from executor.buffers import OptState
from executor.host_memory import HostMemory
from executor.interrupts import CtrlCSafeThread
from slide.calibration.probe_common import (
    MB,
    Figure,
    GridFigure,
    WholeBuffer,
    cuda_median,
    host_median,
    size_grid,
)
from slide.fileio import fsync_path
from slide_ir.specs.hardware_parts import format_grid

HostUnit = tuple[torch.Tensor, list[Part], torch.Tensor]  # gradient, state parts, output


# -- host link ------------------------------------------------------------------------------------
# The copy curve's sizes (`Link.h2d_grid`, `d2h_grid`) below the link probe's own: latency-bound,
# halfway and nearly at the rate (`slide_ir.planning.host_rates`); ~10 ms of copies in all.
COPY_GRID = (64 << 10, 1 << 20, 16 << 20)


def link_rates(size_mb: int = 1024, grid: Sequence[int] = COPY_GRID) -> dict[str, Any]:
    """Pinned and pageable copies of `size_mb` each way and both at once, and the pinned copy
    curves: `grid`'s sizes (prefixes of the same buffers) and `size_mb` itself."""
    n = size_mb * MB
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(n, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pinned2 = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.uint8)
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(up):
            dev.copy_(pinned, non_blocking=True)
        with torch.cuda.stream(down):
            pinned2.copy_(dev2, non_blocking=True)
        up.synchronize()
        down.synchronize()

    note = f"{size_mb} MiB copies"

    def pageable_up() -> None:
        dev.copy_(pageable)
        torch.cuda.synchronize()

    def upload_s(b: int) -> float:
        return cuda_median(lambda: dev[:b].copy_(pinned[:b], non_blocking=True))

    def download_s(b: int) -> float:
        return cuda_median(lambda: pinned[:b].copy_(dev[:b], non_blocking=True))

    ways = {"h2d": upload_s, "d2h": download_s}
    full = {way: copy(n) for way, copy in ways.items()}
    curves = {
        f"{way}_grid": size_grid(
            {b: copy(b) for b in grid if b < n} | {n: full[way]}, f"pinned {way}, each size"
        )
        for way, copy in ways.items()
    }
    return {
        **{way: Figure(n / full[way], f"pinned {way}, {note}") for way in ways},
        **curves,
        "duplex": Figure(
            n / host_median(both), f"each way with h2d and d2h on two streams at once, {note}"
        ),
        "pageable_h2d": Figure(n / host_median(pageable_up), f"pageable h2d, {note}"),
        "pageable_d2h": Figure(
            n / host_median(lambda: pageable.copy_(dev)), f"pageable d2h, {note}"
        ),
    }


# -- CPU ----------------------------------------------------------------------------------------
class _DmaLoad:
    """Both copy engines busy (pinned h2d and d2h, 256 MiB copies in a loop) while a CPU probe
    runs: the DRAM traffic a sliding backward puts beside the host update."""

    def __init__(self, size_mb: int = 256) -> None:
        n = size_mb * MB
        self.bufs = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.devs = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2)]
        self.stop = threading.Event()
        self.thread = CtrlCSafeThread(target=self._run, daemon=True)

    def _run(self) -> None:
        up, down = torch.cuda.Stream(), torch.cuda.Stream()
        while not self.stop.is_set():
            with torch.cuda.stream(up):
                self.devs[0].copy_(self.bufs[0], non_blocking=True)
            with torch.cuda.stream(down):
                self.bufs[1].copy_(self.devs[1], non_blocking=True)
            up.synchronize()
            down.synchronize()

    def __enter__(self) -> _DmaLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


ADAM_UNITS = 4  # units the host-update probe walks through in turn, as a step walks its layers
ADAM_BYTES_PER_ELEMENT = 16  # FP32 master + two moments, BF16 gradient and output
ADAM_RAM_SHARE = 8  # the probe's units take at most 1/8 of the host's RAM


def host_update_unit(layer_params: int, units: int = ADAM_UNITS) -> int:
    """Elements per unit of the host-update probe: one decoder layer, shrunk so that `units` of
    them fit in 1/ADAM_RAM_SHARE of the host's RAM (a 405B layer is 3.2e9 elements: four would
    take 205 GB)."""
    fit = host_ram_bytes() // (ADAM_RAM_SHARE * units * ADAM_BYTES_PER_ELEMENT)
    return max(1, min(layer_params, fit))


def host_update_units(count: int, elements: int, memory: HostMemory) -> list[HostUnit]:
    """`count` units of `elements` as the executor holds them for the host update: FP32 master
    and moments pageable, the BF16 gradient and output from `memory` (pinned when it pins)."""

    units = []
    for _ in range(count):
        state = OptState(
            master=torch.full((elements,), 0.01), m=torch.zeros(elements), v=torch.zeros(elements)
        )
        grad = memory.empty(elements, torch.bfloat16).fill_(1e-3)
        out = memory.empty(elements, torch.bfloat16)
        units.append((grad, [Part(lo=0, hi=elements, state=state)], out))
    return units


def adam_rate(
    threads: int, elements: int = 64 * MB, *, units: int = ADAM_UNITS, under_dma: bool = False
) -> Figure:
    """The executor's own host update (`executor.adam.update_host`) run the way its `cpu` lane
    runs it: BF16 gradients in, FP32 master and moments updated in cache-sized fused chunks,
    BF16 weights cast out in the same pass (28 bytes of DRAM traffic per element); from a thread
    of its own that sets its intra-op threads (as `LaneWorker` does), over `units` units of
    `elements` each in turn (`slide calibrate` uses one decoder layer), gradients and output
    in registered pinned memory (as `HostMemory` allocates them). `under_dma`: with both copy
    engines streaming (`_DmaLoad`), as during a sliding backward.

    The thread matters most: on the H200 host (2026-11-30, `bench/host/host_update_conditions.py`)
    six 3B layers in turn with pinned gradients ran 3.19e9 elem/s from the main thread and
    2.31e9 from a thread of its own; the old probe (one 64M-element buffer, main thread) read
    2.64e9. This probe's 1.99e9 on that day's calibration lease matched the executor's steps."""

    memory = HostMemory(pin=torch.cuda.is_available())
    try:
        work = host_update_units(units, elements, memory)
        with _DmaLoad() if under_dma else contextlib.nullcontext():
            seconds = _update_seconds(work, elements, threads)
    finally:
        memory.close()
    load = ", h2d + d2h copies running" if under_dma else ""
    return Figure(
        elements / seconds,
        f"executor host AdamW (bf16 grads, fused bf16 cast) from a lane thread, {units} units of "
        f"{elements / 1e6:.0f}M elements in turn, {threads} threads{load}",
        threads,
        elements,
    )


def _update_seconds(work: list[HostUnit], elements: int, threads: int) -> float:
    """Seconds per unit of the host update over `work`'s units in turn, from a lane thread of
    its own at `threads` intra-op threads (the median of 3 passes after one)."""
    hp = StepHp(step=1, lr=1e-4, config=AdamWConfig(lr=1e-4, weight_decay=0.01))
    layout = WholeBuffer(elements)

    def lane() -> float:
        torch.set_num_threads(threads)
        scratch = HostScratch(bf16_moments=False)

        def one_pass() -> None:
            for grad, parts, out in work:
                update_host(layout, grad, parts, out, hp, scratch)

        return host_median(one_pass, repeats=3) / len(work)

    previous = torch.get_num_threads()
    try:
        return _in_thread(lane)
    finally:
        torch.set_num_threads(previous)


# The host update's curve (`Cpu.adam_grid`) at unit sizes below the probe's own (which the
# profile adds): a small model's layers (1M elements: its fixed cost shows) and a mid one's (8M)
ADAM_GRID = (1 << 20, 1 << 23)


def adam_grid(threads: Sequence[int], sizes: Sequence[int] = ADAM_GRID) -> GridFigure:
    """`adam_rate` at each of `sizes` and each of `threads` (the units allocated once a size):
    `Cpu.adam_grid` points, `ELEMENTSxTHREADS:GELEM/S`. At the default sizes ~0.5 s."""
    memory = HostMemory(pin=torch.cuda.is_available())
    points = []
    try:
        for n in sizes:
            work = host_update_units(ADAM_UNITS, n, memory)
            points += [((n, t), n / _update_seconds(work, n, t) / 1e9) for t in threads]
    finally:
        memory.close()
    note = f"executor host AdamW from a lane thread, {ADAM_UNITS} units in turn, each size"
    return GridFigure(format_grid(points), note, len(points))


def _in_thread(fn: Callable[[], float]) -> float:
    """fn's result, run in a new thread (its exception re-raised here)."""
    result: list[float] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = CtrlCSafeThread(target=body, name="calibrate-cpu-lane")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def cast_rate(threads: int, elements: int = 64 * MB) -> Figure:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.rand(elements)
        dst = torch.empty(elements, dtype=torch.bfloat16)
        rate = elements / host_median(lambda: dst.copy_(src))
    finally:
        torch.set_num_threads(previous)
    return Figure(rate, f"fp32 -> bf16 copy, {elements / 1e6:.0f}M elements, {threads} threads")


def host_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# -- NVMe ---------------------------------------------------------------------------------------
# The drive curve's request sizes (`Nvme.read_grid`, `write_grid`) below the probe's transfer:
# a block, a mid request, a large one (~0.1 s on a 1.5 GB/s drive)
NVME_GRID = (4 << 10, 256 << 10, 16 << 20)
REQUEST_REPEATS = 5  # requests of each size, at distinct offsets; their median is the point


def nvme_rates(
    directory: Path, size_mb: int = 2048, grid: Sequence[int] = NVME_GRID
) -> dict[str, Any]:
    """Reads and writes of one drive file through the executor's own store (kvikio on CUDA
    where it imports, O_DIRECT files otherwise), in transfers of `NVME_TRANSFER_MB`, taken in
    turn as the nvme lane takes them: read a region written earlier, overwrite another. The
    file is laid out first (two regions of `size_mb`), so every timed write overwrites, as the
    steps' writes do after set-up. On the H200 machine's disk a first write ran at 1.54 GB/s
    where the steps' overwrites ran at 2.6, and a read timed right after 4 GiB of writes ran at
    0.91-1.32 GB/s where the same lease's steps read at 1.45-1.61.

    Then the drive's request curves: requests of each of `grid`'s sizes, one at a time as the
    nvme lane issues an op's (`Nvme.read_grid`, `write_grid`, with the transfer's own point)."""
    from executor.nvme import NvmeStore, backend_for
    from executor.nvme_io import aligned_empty

    block = min(NVME_TRANSFER_MB, size_mb) * MB
    region = size_mb * MB
    transfers = range(0, region, block)
    src, dst = aligned_empty(block, torch.uint8), aligned_empty(block, torch.uint8)
    src.random_(0, 256)
    store = NvmeStore(directory, 1, {0: 2 * region}, backend=backend_for(torch.cuda.is_available()),
                      tag=f".calibrate-{os.getpid()}")  # fmt: skip
    try:
        for offset in range(0, 2 * region, block):  # lay the file out
            store.write(0, offset, src)
        fsync_path(store.paths[0])
        read_s = write_s = 0.0
        for offset in transfers:
            t0 = time.perf_counter()
            store.read(0, offset, dst)
            t1 = time.perf_counter()
            store.write(0, region + offset, src)
            read_s, write_s = read_s + t1 - t0, write_s + time.perf_counter() - t1
        t0 = time.perf_counter()
        fsync_path(store.paths[0])  # a buffered fallback's writes, before the clock stops
        write_s += time.perf_counter() - t0
        how = store.kind
        sizes = [b for b in grid if b < block]
        reads = {b: _request_s(lambda o, b=b: store.read(0, o, dst[:b]), b, region) for b in sizes}
        writes = {
            b: _request_s(lambda o, b=b: store.write(0, region + o, src[:b]), b, region)
            for b in sizes
        }
    finally:
        store.close()
    note = f"{size_mb} MiB sequential, {block // MB} MiB transfers, {how}, reads and overwrites in turn"
    count, how = len(transfers), f"one {how} request at a time, each size"
    return {
        "read": Figure(region / read_s, note),
        "write": Figure(region / write_s, note),
        "read_grid": size_grid(reads | {block: read_s / count}, how),
        "write_grid": size_grid(writes | {block: write_s / count}, how),
    }


def _request_s(request: Callable[[int], object], size: int, span: int) -> float:
    """The median seconds of `REQUEST_REPEATS` calls `request(offset)` (after one), each at its
    own `size`-aligned offset within `span` bytes (a drive's cache cannot serve one again)."""
    offsets = itertools.count(0, size)
    return host_median(lambda: request(next(offsets) % (span - span % size)), REQUEST_REPEATS)


NVME_TRANSFER_MB = 128  # about a 3B layer's inputs at batch 16 (100 MB); a unit's state is more
