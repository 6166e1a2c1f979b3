"""`slide calibrate`: measure this CUDA machine and write a machine profile (TOML) whose every
figure says `measured: <device>, <date>` and how. `plan`, `simulate` and `train` accept it."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path

from slide.errors import UserError
from slide.fileio import write_atomic
from slide_ir.hardware import (
    Cpu,
    Gpu,
    Link,
    Machine,
    Nvme,
    UnknownHardwareError,
    gpu_names,
    load_gpu,
    machine_to_toml,
)
from slide_ir.model import load_model

NAME = "calibrate"
HELP = "measure this CUDA machine's rates and write a machine profile (TOML)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="llama-3.1-8b", help="layer shapes to time [llama-3.1-8b]"
    )
    parser.add_argument("--nvme-dir", help="a directory on the NVMe drive to measure (optional)")
    parser.add_argument("--name", help="machine name in the profile [hostname]")
    parser.add_argument("--out", required=True, help="profile to write (.toml)")


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from executor import calibrate as cal
    from executor.train import default_optimizer_threads

    if not torch.cuda.is_available():
        raise UserError("calibrate needs a CUDA GPU; none is visible here")
    model = load_model(args.model)
    device = torch.cuda.get_device_name()
    stamp = f"measured: {device}, {datetime.date.today().isoformat()}, slide calibrate"
    cores = len(os.sched_getaffinity(0))
    threads = default_optimizer_threads()  # the executor's optimizer threads on a CUDA host
    layer = cal.host_update_unit(model.layer_params)  # the host update's unit
    probes = {
        "matmul": lambda: cal.matmul_rate(model),
        "attention": lambda: cal.attention_rate(model),
        "hbm": cal.hbm_rate,
        "lce": lambda: cal.lce_rate(model),
        "elementwise": lambda: cal.elementwise_rate(model),
        "gpu_adam": cal.gpu_adam_rate,
        "link": cal.link_rates,
        "adam_all": lambda: cal.adam_rate(threads, layer),
        "adam_half": lambda: cal.adam_rate(max(1, threads // 2), layer),
        "adam_under_dma": lambda: cal.adam_rate(threads, layer, under_dma=True),
        "cast": lambda: cal.cast_rate(cores),
    }
    if args.nvme_dir:
        probes["nvme"] = lambda: cal.nvme_rates(Path(args.nvme_dir))
    got = {}
    for key in tqdm(probes, desc="calibrate", unit="probe"):
        got[key] = probes[key]()
    machine = _machine(args.name or platform.node() or "calibrated", device, cores, got, stamp)
    write_atomic(args.out, _header(got) + machine_to_toml(machine))
    print(f"profile written to {args.out}")
    return 0


def _machine(name: str, device: str, cores: int, got: dict, stamp: str) -> Machine:  # type: ignore[type-arg]
    import torch

    from executor import calibrate as cal

    peak, peak_source = _datasheet_peak(device, got["matmul"].value / 1e12)
    sources = {"gpu.bf16_peak_tflops": peak_source}
    gpu = Gpu(
        name=device.lower().replace(" ", "-"),
        memory_bytes=torch.cuda.get_device_properties(0).total_memory,
        bf16_peak_tflops=peak,
        bf16_matmul_tflops=got["matmul"].value / 1e12,
        hbm_bytes_per_s=got["hbm"].value,
        attention_tflops=got["attention"].value / 1e12,
        lce_logits_per_s=got["lce"].value,
        elementwise_bytes_per_s=got["elementwise"].value,
        adam_elems_per_s=got["gpu_adam"].value,
    )
    link = got["link"]
    adam_all, adam_half, loaded = got["adam_all"], got["adam_half"], got["adam_under_dma"]
    half = adam_half.threads
    # A per-core rate from the half-core run and a DRAM bound from the all-core run (28 B/elem):
    # rate(threads) = min(threads * per_core, dram / 28) reproduces both measurements.
    cpu = Cpu(
        name=f"{platform.processor() or platform.machine()}-{cores}c",
        cores=cores,
        adam_elems_per_s_per_core=adam_half.value / half,
        cast_elems_per_s_per_core=got["cast"].value / cores,
        dram_bytes_per_s=max(adam_all.value, adam_half.value) * 28,
        dram_under_dma_bytes_per_s=loaded.value * 28,
        simd="measured host",
    )
    drives = ()
    if "nvme" in got:
        drives = (
            Nvme(
                name="calibrated-drive",
                capacity_bytes=_free_bytes(),
                gds=False,
                read_bytes_per_s=got["nvme"]["read"].value,
                write_bytes_per_s=got["nvme"]["write"].value,
            ),
        )
    notes = {
        "gpu.memory_bytes": "torch.cuda.get_device_properties().total_memory",
        "gpu.bf16_matmul_tflops": got["matmul"].note,
        "gpu.hbm_bytes_per_s": got["hbm"].note,
        "gpu.attention_tflops": got["attention"].note,
        "gpu.lce_logits_per_s": got["lce"].note,
        "gpu.elementwise_bytes_per_s": got["elementwise"].note,
        "gpu.adam_elems_per_s": got["gpu_adam"].note,
        "link.h2d_bytes_per_s": link["h2d"].note,
        "link.d2h_bytes_per_s": link["d2h"].note,
        "link.duplex_bytes_per_s": link["duplex"].note,
        "link.pageable_h2d_bytes_per_s": link["pageable_h2d"].note,
        "link.pageable_d2h_bytes_per_s": link["pageable_d2h"].note,
        "cpu.cores": "os.sched_getaffinity",
        "cpu.simd": "not probed",
        "cpu.adam_elems_per_s_per_core": adam_half.note + f" / {half}",
        "cpu.dram_bytes_per_s": adam_all.note + " x 28 B/element",
        "cpu.dram_under_dma_bytes_per_s": loaded.note + " x 28 B/element",
        "cpu.cast_elems_per_s_per_core": got["cast"].note + f" / {cores}",
        "ram_bytes": "os.sysconf physical pages",
    }
    if drives:
        notes |= {
            f"nvme[0].{k}": got["nvme"]["read"].note
            for k in ("read_bytes_per_s", "write_bytes_per_s", "capacity_bytes", "gds")
        }
    sources |= {k: f"{stamp}: {v}" for k, v in notes.items()}
    return Machine(
        name=name,
        gpu=gpu,
        link=Link(
            name="measured-link",
            h2d_bytes_per_s=link["h2d"].value,
            d2h_bytes_per_s=link["d2h"].value,
            duplex_bytes_per_s=link["duplex"].value,
            pageable_h2d_bytes_per_s=link["pageable_h2d"].value,
            pageable_d2h_bytes_per_s=link["pageable_d2h"].value,
        ),
        cpu=cpu,
        ram_bytes=cal.host_ram_bytes(),
        nvme=drives,
        price_usd=None,
        sources=sources,
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


def _free_bytes() -> int:
    st = os.statvfs(".")
    return st.f_bavail * st.f_frsize


def _header(got: dict) -> str:  # type: ignore[type-arg]
    lines = ["# slide calibrate: raw probe results"]
    for key, fig in got.items():
        for sub, f in fig.items() if isinstance(fig, dict) else [("", fig)]:
            lines.append(f"# {key}{'.' + sub if sub else ''}: {f.value:.4g} ({f.note})")
    return "\n".join(lines) + "\n"
