"""The hardware parts as frozen dataclasses: what the planner and the cost model read.

A `Machine` is a GPU, the host link it sits on, the CPU that runs the optimizer update, usable DRAM
and NVMe drives. Fields are in base units (bytes, bytes/s, elements/s, TFLOP/s). Each figure field
names its TOML key in human units (`_toml("memory_gib", GIB)`), so `figures(cls)` is the one table
that the loader, the writer and validation share. `slide_ir.specs.hardware` re-exports these classes and
loads them from the catalog; import them from there.

Invariant: every figure is positive and finite (sizes and core counts whole), strings non-empty;
`__post_init__` raises ValueError naming the field otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any

GIB = 2**30  # memory sizes follow the DIMM / nvidia-smi convention: "24 GB" is 24 GiB
G = 10**9  # rates and drive sizes are decimal


def _toml(key: str, scale: int, **default: Any) -> Any:
    """Field metadata: the figure's TOML key, in human units, and the factor to base units."""
    return field(metadata={"toml": (key, scale)}, **default)


@dataclass(frozen=True, slots=True)
class Figure:
    """One sourced figure: its TOML key and scale, and the dataclass field it fills."""

    key: str  # TOML key, in human units
    scale: int  # base value = TOML value x scale (a power of ten, or 2**30)
    field: str  # dataclass field, in base units
    kind: type  # int, float, str or bool
    optional: bool = False  # may be absent (the field defaults to None)


# Annotations are strings here (PEP 563): a figure field must be spelled one of these ways.
_TYPES: dict[object, type] = {"int": int, "int | None": int, "float": float, "float | None": float,
                              "str": str, "str | None": str, "bool": bool}  # fmt: skip


def _key_scale(f: Field[Any]) -> tuple[str, int]:
    key, scale = f.metadata.get("toml", (f.name, 1))
    return key, scale


def figures(cls: type) -> tuple[Figure, ...]:
    """The sourced figures of a dataclass: every plain-typed field except `name`."""
    plain = [f for f in fields(cls) if f.type in _TYPES and f.name != "name"]
    return tuple(
        Figure(*_key_scale(f), f.name, _TYPES[f.type], optional=f.default is None) for f in plain
    )


_WANT = {int: "a whole number > 0", float: "a finite number > 0", str: "a non-empty string",
         bool: "true or false"}  # fmt: skip


def _valid(value: Any, kind: type) -> bool:
    if kind in (str, bool):
        return isinstance(value, kind) and value != ""
    number = isinstance(value, int if kind is int else int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def _validate(obj: object) -> None:
    """Checks every figure of a part (and its name) against its type; ValueError names the field."""
    for fig in (Figure("name", 1, "name", str), *figures(type(obj))):
        value = getattr(obj, fig.field)
        if not _valid(value, fig.kind) and not (value is None and fig.optional):
            raise ValueError(
                f"{type(obj).__name__}.{fig.field} must be {_WANT[fig.kind]}, got {value!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One accelerator. Achieved rates (not datasheet peaks) drive the cost model."""

    name: str
    memory_bytes: int = _toml("memory_gib", GIB)
    bf16_peak_tflops: float  # dense BF16 tensor rate, FP32 accumulate (datasheet)
    bf16_matmul_tflops: float  # achieved bf16 matmul rate
    hbm_bytes_per_s: float = _toml("hbm_gb_per_s", G)  # device-memory bandwidth (datasheet)
    attention_tflops: float  # achieved fused-attention (SDPA / flash) rate, forward + backward
    # SDPA's rate with a boolean mask (packed documents), forward + backward, its FLOPs counted
    # as the causal kernel's (the masked kernel computes every pair, so this is at most about
    # half its raw rate; None: the causal curve with every block computed)
    masked_attention_tflops: float | None = None
    # Measured rates of our own kernels (None: the cost model falls back to matmul + HBM):
    # the fused LCE's logits per second, forward + backward, GEMMs included
    lce_logits_per_s: float | None = _toml("lce_glogits_per_s", G, default=None)
    # bytes/s the layers' memory-bound kernels reach (RMSNorm, RoPE, SwiGLU, residual adds)
    elementwise_bytes_per_s: float | None = _toml("elementwise_gb_per_s", G, default=None)
    # the executor's fused AdamW on the device (BF16 grads and weights, FP32 master + moments)
    adam_elems_per_s: float | None = _toml("adam_gelems_per_s", G, default=None)
    # GPU-to-GPU link inside one node (NVLink through NVSwitch), per GPU, each direction, as
    # NCCL's ring collectives reach it (None: no such link, peers talk over PCIe; see
    # `Machine.peer_bytes_per_s`)
    nvlink_bytes_per_s: float | None = _toml("nvlink_gb_per_s", G, default=None)
    # Host time to issue one op's kernels (Python, autograd, Triton and CUDA launches), a floor
    # under its GPU time that no rate above describes: what a decoder layer's forward (and
    # recompute), its backward and the fused loss take at a tiny shape (None: no floor)
    layer_fwd_floor_s: float | None = None
    layer_bwd_floor_s: float | None = None
    loss_floor_s: float | None = None
    # Streaming multiprocessors (datasheet or the driver): the wave-quantisation term of the
    # shape curves (`slide_ir.planning.gpu_rates`; None: no such term)
    sm_count: int | None = None
    # Measured rates at the probes' shapes, `DIMS:TFLOPS` items (`parse_grid`): GEMMs as MxNxK,
    # causal attention as BATCHxHEADSxSEQxHEAD_DIM (None: the derived curves alone)
    gemm_grid: str | None = None
    attention_grid: str | None = None

    def __post_init__(self) -> None:
        _validate(self)
        parse_grid(self.gemm_grid, dims=3)  # a bad point fails here, naming itself
        parse_grid(self.attention_grid, dims=4)
        # GeForce cards boost past their rated clock, so an achieved rate may top the datasheet a
        # little; 1.5x the peak catches unit slips (TFLOP/s written as GFLOP/s) instead.
        for name in ("bf16_matmul_tflops", "attention_tflops"):
            if getattr(self, name) > 1.5 * self.bf16_peak_tflops:
                raise ValueError(f"Gpu.{name} must be <= 1.5 x bf16_peak_tflops")


def parse_grid(
    text: str | None, dims: int | None = None
) -> tuple[tuple[tuple[int, ...], float], ...]:
    """A profile's grid string, `DIMS:RATE` items separated by spaces (dims `x`-joined), as
    (dims, rate) pairs; None or "" is no grid. `dims`: how many dims each point must have.
    Rates are in the grid's own unit (TFLOP/s for the GPU's, G per second for the host's)."""
    points = []
    for item in (text or "").split():
        size, sep, rate = item.partition(":")
        try:
            point = (tuple(int(d) for d in size.split("x")), float(rate))
        except ValueError:
            point = ((), 0.0)
        wrong = dims is not None and len(point[0]) != dims
        if not sep or not point[0] or not point[1] > 0 or min(point[0]) < 1 or wrong:
            want = f"{dims} dims" if dims else "DIMS:RATE"
            raise ValueError(f"bad grid point {item!r}: expected {want}, e.g. 8192x4096x4096:700")
        points.append(point)
    return tuple(points)


def format_grid(points: Iterable[tuple[Sequence[int], float]]) -> str:
    return " ".join(f"{'x'.join(map(str, dims))}:{rate:.4g}" for dims, rate in points)


def scale_grid(text: str, factor: float) -> str:
    """Every point's rate times `factor` (a re-fit moves a grid with the rate it corrects)."""
    return format_grid((d, r * factor) for d, r in parse_grid(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """The host link, pinned and pageable rates; `duplex` is each way while both directions run."""

    name: str
    h2d_bytes_per_s: float = _toml("h2d_gb_per_s", G)
    d2h_bytes_per_s: float = _toml("d2h_gb_per_s", G)
    duplex_bytes_per_s: float = _toml("duplex_gb_per_s", G)
    pageable_h2d_bytes_per_s: float = _toml("pageable_h2d_gb_per_s", G)
    pageable_d2h_bytes_per_s: float = _toml("pageable_d2h_gb_per_s", G)
    # Measured pinned copies at their sizes, `BYTES:GB/S` items (`parse_grid`; None: the
    # derived curve alone, `slide_ir.planning.host_rates`)
    h2d_grid: str | None = None
    d2h_grid: str | None = None

    def __post_init__(self) -> None:
        _validate(self)
        parse_grid(self.h2d_grid, dims=1)
        parse_grid(self.d2h_grid, dims=1)


def default_optimizer_threads(cores: int, nproc: int = 1) -> int:
    """Every core but four, shared by `nproc` data-parallel ranks: the one rule the cost model,
    the executor and `--help` use. The gpu lane's thread issuing kernels, autograd's device
    thread, the copy lanes and the main thread need their cores; on the H200 host (16 vCPUs)
    12 optimizer threads ran a 3B step 7% faster than 14 (bench/RESULTS.md), and N ranks x 12
    threads on 16 cores would only fight."""
    return max(1, (cores - 4) // nproc)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cpu:
    """The host CPU as the optimizer sees it: per-core streaming rates capped by DRAM bandwidth."""

    name: str
    cores: int
    adam_elems_per_s_per_core: float  # fused fp32 AdamW step, one thread
    cast_elems_per_s_per_core: float  # fp32 -> bf16 cast, one thread
    dram_bytes_per_s: float = _toml("dram_gb_per_s", G)  # sustained, the CPU alone
    # what the CPU still gets while both copy engines stream to and from host RAM (None: as
    # above): the copy engines take their share of the DRAM bandwidth during a sliding backward
    dram_under_dma_bytes_per_s: float | None = _toml("dram_under_dma_gb_per_s", G, default=None)
    simd: str
    # The host AdamW measured at unit sizes and thread counts, `ELEMENTSxTHREADS:GELEM/S` items
    # (`parse_grid`; None: the derived curve alone, `slide_ir.planning.host_rates`)
    adam_grid: str | None = None

    def __post_init__(self) -> None:
        _validate(self)
        parse_grid(self.adam_grid, dims=2)

    def optimizer_threads(self, nproc: int = 1) -> int:
        """The host update's threads when none are asked for (`default_optimizer_threads`)."""
        return default_optimizer_threads(self.cores, nproc)

    def adam_elems_per_s(
        self, *, threads: int | None = None, bytes_per_elem: int = 28, dma_load: float = 0.0
    ) -> float:
        """AdamW elements/s: min(threads x per-core rate, DRAM / bytes touched per element).
        `dma_load` (0 to 1) is how much of the copy engines' full duplex traffic runs beside
        the update: the DRAM bandwidth left falls linearly from the lone figure to the one
        measured under full load (when the profile has it).

        An fp32 step reads param, grad, m, v (16 B) and writes param, m, v (12 B): 28 B. Callers
        with bf16 grads or a fused bf16 weight write pass their own byte count.
        """
        if not 0.0 <= dma_load <= 1.0:
            raise ValueError(f"dma_load must be within [0, 1], got {dma_load}")
        dram = self.dram_bytes_per_s
        if self.dram_under_dma_bytes_per_s is not None:
            dram += dma_load * (self.dram_under_dma_bytes_per_s - dram)
        return self._rate(self.adam_elems_per_s_per_core, threads, bytes_per_elem, dram)

    def cast_elems_per_s(self, *, threads: int | None = None, bytes_per_elem: int = 6) -> float:
        """fp32 -> bf16 cast elements/s, same form as Adam (read 4 B, write 2 B by default)."""
        return self._rate(
            self.cast_elems_per_s_per_core, threads, bytes_per_elem, self.dram_bytes_per_s
        )

    def _rate(
        self, per_core: float, threads: int | None, bytes_per_elem: int, dram: float
    ) -> float:
        # Threads beyond `cores` add nothing: SMT siblings share the core's memory pipeline.
        n = self.cores if threads is None else threads
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
        if not bytes_per_elem > 0:
            raise ValueError(f"bytes_per_elem must be > 0, got {bytes_per_elem!r}")
        return min(min(n, self.cores) * per_core, dram / bytes_per_elem)


@dataclass(frozen=True, slots=True, kw_only=True)
class Nvme:
    """One drive; `gds` says whether GPUDirect Storage works with it on this machine."""

    name: str
    capacity_bytes: int = _toml("capacity_gb", G)
    read_bytes_per_s: float = _toml("read_gb_per_s", G)  # large sequential requests
    write_bytes_per_s: float = _toml("write_gb_per_s", G)
    gds: bool
    # Measured requests at their sizes, one at a time as the nvme lane issues them, `BYTES:GB/S`
    # items (`parse_grid`; None: the derived curve alone, `slide_ir.planning.host_rates`)
    read_grid: str | None = None
    write_grid: str | None = None

    def __post_init__(self) -> None:
        _validate(self)
        parse_grid(self.read_grid, dims=1)
        parse_grid(self.write_grid, dims=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """GPU + link + CPU + usable DRAM + drives; `sources` maps e.g. "gpu.bf16_matmul_tflops"."""

    name: str
    gpu: Gpu
    link: Link
    cpu: Cpu
    ram_bytes: int = _toml("ram_gib", GIB)  # usable DRAM
    nvme: tuple[Nvme, ...] = ()
    price_usd: float | None = _toml("price_usd", 1, default=None)
    # GPUs of this model in the node, for data-parallel plans (None: not stated; a plan may
    # then ask for up to 8, one node's usual count)
    gpus: int | None = _toml("gpus", 1, default=None)
    sources: tuple[tuple[str, str], ...] = ()  # sorted (key, source) pairs

    def __post_init__(self) -> None:
        _validate(self)  # name, ram_bytes, price_usd
        for name, cls in (("gpu", Gpu), ("link", Link), ("cpu", Cpu)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"Machine.{name} must be a {cls.__name__}")
        if not isinstance(self.nvme, tuple) or not all(isinstance(d, Nvme) for d in self.nvme):
            raise ValueError("Machine.nvme must be a tuple of Nvme")
        if isinstance(self.sources, Mapping):  # accept a mapping, store it as sorted pairs
            object.__setattr__(self, "sources", freeze_sources(self.sources))

    @property
    def peer_bytes_per_s(self) -> float:
        """GPU-to-GPU rate per GPU, each direction: NVLink where the GPU has it, else PCIe
        peer-to-peer at the host link's duplex rate (a ring sends and receives at once)."""
        return self.gpu.nvlink_bytes_per_s or self.link.duplex_bytes_per_s

    def source(self, key: str) -> str:
        """Where a figure came from, e.g. `source("cpu.dram_bytes_per_s")`."""
        return dict(self.sources)[key]


def freeze_sources(sources: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Sources as stored on a Machine: (key, source) pairs sorted by key."""
    return tuple(sorted(sources.items()))
