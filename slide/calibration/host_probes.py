"""The probes a machine profile is measured with, at two sizes, and the profile they make.

`slide calibrate` runs them at `CALIBRATE` sizes (whole decoder layers for the host update, 1 GiB
copies; about 3 minutes on the H200 host); `--machine auto` at `AUTO` sizes, picked to take at
most ~20 s together there (see `AUTO`). Both build the same `Machine` with `profile`, every figure
sourced `measured: <GPU>, <date>, <how>`, and both describe the host with `Host`, whose `key`
names its entry in the profile cache (`slide.calibration.auto_machine`).

The probes themselves are `slide.calibration.gpu_probes`' and `host_rate_probes`'; the table
below only picks their sizes, so a test can monkeypatch those functions and run everything else
here without a GPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slide_ir.specs.hardware import (
    Cpu,
    Gpu,
    Link,
    Machine,
    Nvme,
    UnknownHardwareError,
    gpu_names,
    load_gpu,
)
from slide_ir.specs.hardware_parts import format_grid, freeze_sources, parse_grid
from slide_ir.specs.model_catalog import load_model

log = logging.getLogger(__name__)
GIB = 1 << 30
MIB = 1 << 20
# part of every cache key: bump it when the probes change what they measure (3: the shape grids;
# 4: the host curves' grids; an entry of an older version is never read, so the next run
# measures the host again)
PROFILE_VERSION = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """What a measured profile belongs to; two hosts alike in all of it share a cache entry."""

    gpu: str  # torch.cuda.get_device_name
    gpu_memory_bytes: int
    cpu: str  # /proc/cpuinfo "model name" (else platform.processor / machine)
    cores: int  # usable cores (sched_getaffinity): the probes' and the executor's threads
    ram_bytes: int  # physical memory
    sms: int = 0  # the GPU's streaming multiprocessors (0: unknown)

    @property
    def key(self) -> str:
        """A file-name-safe key: readable parts, then a digest of the exact description (memory
        sizes in whole GiB: the kernel's reserve moves MemTotal by a few MiB between boots)."""
        gpu_gib, ram_gib = round(self.gpu_memory_bytes / GIB), round(self.ram_bytes / GIB)
        exact = [PROFILE_VERSION, self.gpu, gpu_gib, self.cpu, self.cores, ram_gib]
        digest = hashlib.sha256(json.dumps(exact).encode()).hexdigest()[:10]
        return f"{_slug(self.gpu)}-{gpu_gib}g--{_slug(self.cpu)}-{self.cores}c-{ram_gib}g--{digest}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "unknown"


def this_host(device: Any) -> Host:
    """The host `device` (a CUDA torch.device) sits in."""
    import torch

    from slide.calibration.host_rate_probes import host_ram_bytes

    return Host(
        gpu=torch.cuda.get_device_name(device),
        gpu_memory_bytes=torch.cuda.get_device_properties(device).total_memory,
        cpu=cpu_model(),
        cores=usable_cores(),
        ram_bytes=host_ram_bytes(),
        sms=torch.cuda.get_device_properties(device).multi_processor_count,
    )


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass  # not Linux: platform's answer below
    return platform.processor() or platform.machine() or "unknown-cpu"


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeSizes:
    """How big each probe is; the GPU probes time `model`'s layer shapes."""

    model: str
    matmul_tokens: int
    attention_batch: int
    attention_seq: int
    hbm_mb: int
    lce_tokens: int
    elementwise_tokens: int
    gpu_adam_elements: int
    link_mb: int
    adam_elements: int | None  # per unit of the host update; None: one decoder layer
    cast_elements: int


CALIBRATE = ProbeSizes(
    model="llama-3.1-8b", matmul_tokens=8192, attention_batch=4, attention_seq=2048, hbm_mb=2048,
    lce_tokens=8192, elementwise_tokens=16384, gpu_adam_elements=64 * MIB, link_mb=1024,
    adam_elements=None, cast_elements=64 * MIB,
)  # fmt: skip
# `--machine auto` (estimated for the H200 host from its calibrated rates; not yet timed there):
# the GPU probes keep calibrate's sizes but a 1 GiB HBM copy (together < 2 s once Triton's
# kernels are compiled; the compile is cached on disk and the run needs it anyway); the link
# copies drop to 256 MiB (5 ms each at 55 GB/s, past the per-copy overhead; ~1 s with pinning);
# the host update runs 4 units of 64M elements (a llama-3.2-3b layer is 100M; 1.8 GB of DRAM
# traffic per unit, far past any last-level cache) instead of 218M-element 8B layers. Its cost is
# mostly first-touching the 4 GiB each of its three runs (all threads, half, under DMA) allocates:
# 6 s a run on a 2-core CPU-only box, ~1.5-2 s expected with the H200 host's 12 threads, so ~6 s
# for the three; the cast, 32M elements: ~0.1 s. The host curves' grids add ~0.5 s: the update
# at 1M and 8M elements at both thread counts (`host_rate_probes.adam_grid`), and copies of
# 64 KiB to 16 MiB each way on the link probe's buffers (~10 ms). `run_probes` warns when the
# total overruns.
AUTO_BUDGET_S = 20.0
# The dispatch floors (`gpu_probes.dispatch_floors`) are timed on the smallest catalog model,
# whose layer at 16 tokens is microseconds of GPU work: what is left is the host's issuing.
FLOOR_MODEL = "tiny-llama"
AUTO = ProbeSizes(
    model="llama-3.1-8b", matmul_tokens=8192, attention_batch=4, attention_seq=2048, hbm_mb=1024,
    lce_tokens=8192, elementwise_tokens=16384, gpu_adam_elements=64 * MIB, link_mb=256,
    adam_elements=64 * MIB, cast_elements=32 * MIB,
)  # fmt: skip


def probe_table(
    sizes: ProbeSizes, host: Host, nvme_dir: Path | None = None
) -> dict[str, Callable[[], Any]]:
    """The probes in the order they run, each a call that returns a Figure (or a dict of them)."""
    from slide.calibration import gpu_probes as gpu
    from slide.calibration import host_rate_probes as host_rates
    from slide.calibration import shape_probes as shapes
    from slide.session import default_optimizer_threads

    model = load_model(sizes.model)
    threads = default_optimizer_threads()  # the executor's optimizer threads on a CUDA host
    unit = host_rates.host_update_unit(model.layer_params)
    unit = unit if sizes.adam_elements is None else min(unit, sizes.adam_elements)
    s = sizes
    probes: dict[str, Callable[[], Any]] = {
        "matmul": lambda: gpu.matmul_rate(model, s.matmul_tokens),
        "gemm_grid": lambda: shapes.gemm_grid_rates(),
        "attention_grid": lambda: shapes.attention_grid_rates(),
        "attention": lambda: gpu.attention_rate(model, s.attention_batch, s.attention_seq),
        "masked_attention": lambda: gpu.masked_attention_rate(),
        "hbm": lambda: gpu.hbm_rate(s.hbm_mb),
        "lce": lambda: gpu.lce_rate(model, s.lce_tokens),
        "elementwise": lambda: gpu.elementwise_rate(model, s.elementwise_tokens),
        "gpu_adam": lambda: gpu.gpu_adam_rate(s.gpu_adam_elements),
        "floors": lambda: gpu.dispatch_floors(load_model(FLOOR_MODEL)),
        "link": lambda: host_rates.link_rates(s.link_mb),
        "adam_all": lambda: host_rates.adam_rate(threads, unit),
        "adam_half": lambda: host_rates.adam_rate(max(1, threads // 2), unit),
        "adam_grid": lambda: host_rates.adam_grid(sorted({threads, max(1, threads // 2)})),
        "adam_under_dma": lambda: host_rates.adam_rate(threads, unit, under_dma=True),
        "cast": lambda: host_rates.cast_rate(host.cores, s.cast_elements),
    }
    if nvme_dir is not None:
        probes["nvme"] = lambda: host_rates.nvme_rates(nvme_dir)
    return probes


def run_probes(
    probes: Mapping[str, Callable[[], Any]],
    *,
    progress: bool = False,
    budget_s: float | None = None,
) -> dict:  # type: ignore[type-arg]
    """Each probe's result by name; how long each took goes to the log (a warning when together
    they overran `budget_s`: the sizes were picked for one host, and another may be slower)."""
    from tqdm import tqdm

    got, seconds = {}, {}
    for key in tqdm(probes, desc="calibrate", unit="probe", disable=not progress):
        t0 = time.perf_counter()
        got[key] = probes[key]()
        seconds[key] = time.perf_counter() - t0
    total, each = sum(seconds.values()), ", ".join(f"{k} {v:.1f}" for k, v in seconds.items())
    if budget_s is not None and total > budget_s:
        log.warning("the probes took %.1f s, over their %.0f s budget (%s)", total, budget_s, each)
    else:
        log.info("the probes took %.1f s (%s)", total, each)
    return got


def profile(
    name: str, host: Host, got: Mapping[str, Any], stamp: str, nvme_dir: Path | None = None
) -> Machine:
    """The machine the probe results describe; every figure's source is `stamp: <how>`. The
    drive (when `got` has an "nvme" probe) is the one holding `nvme_dir`."""
    peak, peak_source = _datasheet_peak(host.gpu, got["matmul"].value / 1e12)
    link = got["link"]
    drives = () if "nvme" not in got else (_drive(got["nvme"], nvme_dir or Path(".")),)
    notes = _notes(host, got, bool(drives))
    sources = {"gpu.bf16_peak_tflops": peak_source} | {k: f"{stamp}: {v}" for k, v in notes.items()}
    return Machine(
        name=name,
        gpu=_gpu(host, got, peak),
        link=Link(
            name="measured-link",
            **{f"{k}_bytes_per_s": link[k].value for k in _LINK_KEYS},
            h2d_grid=link["h2d_grid"].text,
            d2h_grid=link["d2h_grid"].text,
        ),
        cpu=_cpu(host, got),
        ram_bytes=host.ram_bytes,
        nvme=drives,
        price_usd=None,
        sources=freeze_sources(sources),
    )


def _gpu(host: Host, got: Mapping[str, Any], peak: float) -> Gpu:
    floors = got["floors"]
    return Gpu(
        name=_slug(host.gpu),
        memory_bytes=host.gpu_memory_bytes,
        bf16_peak_tflops=peak,
        bf16_matmul_tflops=got["matmul"].value / 1e12,
        hbm_bytes_per_s=got["hbm"].value,
        attention_tflops=got["attention"].value / 1e12,
        masked_attention_tflops=got["masked_attention"].value / 1e12,
        lce_logits_per_s=got["lce"].value,
        elementwise_bytes_per_s=got["elementwise"].value,
        adam_elems_per_s=got["gpu_adam"].value,
        **{field: floors[k].value for k, field in _FLOOR_FIELDS.items()},
        sm_count=host.sms or None,
        gemm_grid=got["gemm_grid"].text,
        attention_grid=got["attention_grid"].text,
    )


def _cpu(host: Host, got: Mapping[str, Any]) -> Cpu:
    """A per-core rate from the half-core run and a DRAM bound from the all-core run (28 B/elem):
    rate(threads) = min(threads * per_core, dram / 28) reproduces both measurements."""
    adam_all, adam_half, loaded = got["adam_all"], got["adam_half"], got["adam_under_dma"]
    return Cpu(
        name=f"{_slug(host.cpu)}-{host.cores}c",
        cores=host.cores,
        adam_elems_per_s_per_core=adam_half.value / adam_half.threads,
        cast_elems_per_s_per_core=got["cast"].value / host.cores,
        dram_bytes_per_s=max(adam_all.value, adam_half.value) * 28,
        dram_under_dma_bytes_per_s=loaded.value * 28,
        simd="measured host",
        adam_grid=_with_units(got["adam_grid"].text, adam_all, adam_half),
    )


def _notes(host: Host, got: Mapping[str, Any], with_drive: bool) -> dict[str, str]:
    """How each figure of the profile was measured, by its field."""
    adam_all, adam_half, loaded = got["adam_all"], got["adam_half"], got["adam_under_dma"]
    link, floors = got["link"], got["floors"]
    notes = {
        "gpu.memory_bytes": "torch.cuda.get_device_properties().total_memory",
        "gpu.bf16_matmul_tflops": got["matmul"].note,
        "gpu.hbm_bytes_per_s": got["hbm"].note,
        "gpu.attention_tflops": got["attention"].note,
        "gpu.masked_attention_tflops": got["masked_attention"].note,
        "gpu.lce_logits_per_s": got["lce"].note,
        "gpu.elementwise_bytes_per_s": got["elementwise"].note,
        "gpu.adam_elems_per_s": got["gpu_adam"].note,
        "gpu.gemm_grid": got["gemm_grid"].note,
        "gpu.attention_grid": got["attention_grid"].note,
        "link.h2d_grid": link["h2d_grid"].note,
        "link.d2h_grid": link["d2h_grid"].note,
        "cpu.adam_grid": got["adam_grid"].note + "; and the two runs above at the whole unit",
        **{f"gpu.{field}": floors[k].note for k, field in _FLOOR_FIELDS.items()},
        **{f"link.{k}_bytes_per_s": link[k].note for k in _LINK_KEYS},
        "cpu.cores": "os.sched_getaffinity",
        "cpu.simd": "not probed",
        "cpu.adam_elems_per_s_per_core": adam_half.note + f" / {adam_half.threads}",
        "cpu.dram_bytes_per_s": adam_all.note + " x 28 B/element",
        "cpu.dram_under_dma_bytes_per_s": loaded.note + " x 28 B/element",
        "cpu.cast_elems_per_s_per_core": got["cast"].note + f" / {host.cores}",
        "ram_bytes": "os.sysconf physical pages",
    }
    if host.sms:
        notes["gpu.sm_count"] = "torch.cuda.get_device_properties().multi_processor_count"
    if with_drive:
        notes |= {f"nvme[0].{k}": got["nvme"]["read"].note for k in _DRIVE_KEYS}
        notes |= {f"nvme[0].{k}": got["nvme"][k].note for k in ("read_grid", "write_grid")}
    return notes


_FLOOR_FIELDS = {"fwd": "layer_fwd_floor_s", "bwd": "layer_bwd_floor_s", "loss": "loss_floor_s"}
_LINK_KEYS = ("h2d", "d2h", "duplex", "pageable_h2d", "pageable_d2h")
_DRIVE_KEYS = ("read_bytes_per_s", "write_bytes_per_s", "capacity_bytes", "gds")


def _with_units(grid: str, *runs: Any) -> str:
    """The host update's grid with the whole-unit runs (`adam_all`, `adam_half`) as points (one
    where they ran at the same thread count: a one- or two-core host)."""
    points = dict(parse_grid(grid)) | {(f.elements, f.threads): f.value / 1e9 for f in runs}
    return format_grid(sorted(points.items()))


def _drive(rates: Mapping[str, Any], directory: Path) -> Nvme:
    st = os.statvfs(directory)  # its free space is what a run can use
    return Nvme(
        name="calibrated-drive",
        capacity_bytes=st.f_bavail * st.f_frsize,
        gds=False,
        read_bytes_per_s=rates["read"].value,
        write_bytes_per_s=rates["write"].value,
        read_grid=rates["read_grid"].text,
        write_grid=rates["write_grid"].text,
    )


def _datasheet_peak(device: str, measured_tflops: float) -> tuple[float, str]:
    """The catalog GPU whose name appears in the device name keeps its datasheet peak."""
    key = device.lower().replace("nvidia", "").replace(" ", "")
    for name in sorted(gpu_names(), key=len, reverse=True):
        if name.replace("-", "") in key:
            try:
                gpu, sources = load_gpu(name)
            except UnknownHardwareError:
                break
            return gpu.bf16_peak_tflops, sources.get("bf16_peak_tflops", f"catalog gpu {name}")
    return measured_tflops, f"no datasheet match for {device!r}: the measured matmul rate"


def header(title: str, got: Mapping[str, Any]) -> str:
    """The raw probe results as TOML comments, for the top of a profile file."""
    lines = [f"# {title}: raw probe results"]
    for key, fig in got.items():
        for sub, f in fig.items() if isinstance(fig, dict) else [("", fig)]:
            value = f"{f.points} points" if hasattr(f, "points") else f"{f.value:.4g}"
            lines.append(f"# {key}{'.' + sub if sub else ''}: {value} ({f.note})")
    return "\n".join(lines) + "\n"
