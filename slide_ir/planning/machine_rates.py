"""A machine's rates as the cost model uses them: each profile figure times its named efficiency
factor (`Efficiency`, what `slide calibrate` fits from measured traces), and the host's share per
data-parallel rank, resolved once per `CostModel`.

The machine is read through attributes only, so any object shaped like
`slide_ir.specs.hardware.Machine` works.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """Multipliers on the machine's rates (1.0: the profile's figure as is) and fixed latencies."""

    matmul: float = 1.0  # on gpu.bf16_matmul_tflops (already an achieved, not peak, rate)
    hbm: float = 1.0  # on gpu.hbm_bytes_per_s
    link: float = 1.0  # on link.duplex_bytes_per_s
    adam: float = 1.0  # on cpu.adam_elems_per_s
    cast: float = 1.0  # on cpu.cast_elems_per_s
    dram: float = 1.0  # on cpu.dram_bytes_per_s (streaming element-wise CPU work)
    nvme: float = 1.0  # on each drive's read/write rate
    launch_s: float = 10e-6  # fixed cost of every op

    def __post_init__(self) -> None:
        for name in ("matmul", "hbm", "link", "adam", "cast", "dram", "nvme"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Efficiency.{name} must be > 0, got {getattr(self, name)}")
        if self.launch_s < 0:
            raise ValueError(f"Efficiency.launch_s must be >= 0, got {self.launch_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """The machine's rates with efficiencies applied, resolved once (in units per second)."""

    flops: float
    attention: float
    hbm: float
    elementwise: float  # bytes/s of the memory-bound layer kernels
    lce: float | None  # logits/s of the fused loss
    gpu_adam: float | None  # elements/s of the device AdamW
    link: float
    peer: float  # GPU-to-GPU bytes/s per direction (collectives)
    adam: Callable[[int, float], float]  # (bytes per element, DMA load 0..1) -> elements/s
    cast: float
    dram: float
    nvme_read: tuple[float, ...]
    nvme_write: tuple[float, ...]


def resolve_rates(machine: Any, threads: int | None, eff: Efficiency, nproc: int = 1) -> Rates:
    """`machine`'s rates times `eff`; the host's CPU, DRAM and drives shared by `nproc` ranks
    (`threads`: the update threads of all of them together)."""
    gpu, link, cpu = machine.gpu, machine.link, machine.cpu
    drives = tuple(getattr(machine, "nvme", ()) or ())
    share = 1.0 / nproc  # of the host's CPU, DRAM and drives, per rank

    def adam(bytes_per_elem: int, dma_load: float = 1.0) -> float:
        rate = cpu.adam_elems_per_s(
            threads=threads, bytes_per_elem=bytes_per_elem, dma_load=dma_load
        )
        return float(rate) * eff.adam * share

    return Rates(
        flops=gpu.bf16_matmul_tflops * 1e12 * eff.matmul,
        attention=gpu.attention_tflops * 1e12 * eff.matmul,
        hbm=gpu.hbm_bytes_per_s * eff.hbm,
        elementwise=(getattr(gpu, "elementwise_bytes_per_s", None) or gpu.hbm_bytes_per_s)
        * eff.hbm,
        lce=_scaled(getattr(gpu, "lce_logits_per_s", None), eff.matmul),
        gpu_adam=_scaled(getattr(gpu, "adam_elems_per_s", None), eff.hbm),
        link=link.duplex_bytes_per_s * eff.link,
        peer=float(getattr(machine, "peer_bytes_per_s", None) or link.duplex_bytes_per_s),
        adam=adam,
        cast=_cast_rate(cpu, threads) * eff.cast * share,
        dram=cpu.dram_bytes_per_s * eff.dram * share,
        nvme_read=tuple(d.read_bytes_per_s * eff.nvme * share for d in drives),
        nvme_write=tuple(d.write_bytes_per_s * eff.nvme * share for d in drives),
    )


def _scaled(rate: float | None, efficiency: float) -> float | None:
    return None if rate is None else rate * efficiency


def _cast_rate(cpu: Any, threads: int | None) -> float:
    return float(cpu.cast_elems_per_s(threads=threads))
