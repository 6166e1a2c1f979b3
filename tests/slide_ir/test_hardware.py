"""Hardware catalog: presets load, every figure is sourced, overrides, TOML round trip, errors."""

import dataclasses
import shutil
import tomllib
from pathlib import Path

import pytest

from slide_ir.specs import hardware
from slide_ir.specs.hardware import (
    Cpu,
    Gpu,
    HardwareConfigError,
    Link,
    Machine,
    Nvme,
    UnknownHardwareError,
    cpu_names,
    gpu_names,
    load_machine,
    load_machine_toml,
    machine_names,
    machine_to_toml,
    nvme_names,
    with_drives,
)

CATALOG = hardware.CATALOG
TOML_FILES = sorted(CATALOG.glob("hardware/*.toml")) + sorted(CATALOG.glob("machines/*.toml"))
NOT_FIGURES = {"name", "notes", "preset"}
PART_REFERENCES = {"gpu", "link", "cpu", "nvme"}  # `cpu = "epyc-7543"`, `nvme = ["..."]`
GIB = 2**30


def unsourced(table: dict, where: str) -> list[str]:
    """Keys (recursively) that hold a figure without a non-empty `<key>_source`, or orphan sources."""
    bad = []
    for key, value in table.items():
        if isinstance(value, dict):
            bad += unsourced(value, f"{where}.{key}")
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            bad += [m for i, v in enumerate(value) for m in unsourced(v, f"{where}.{key}[{i}]")]
        elif key.endswith("_source"):
            if key.removesuffix("_source") not in table:
                bad.append(f"{where}.{key} (source of nothing)")
        elif key in NOT_FIGURES or (key in PART_REFERENCES and not isinstance(value, int | float)):
            continue
        elif not str(table.get(f"{key}_source", "")).strip():
            bad.append(f"{where}.{key}")
    return bad


@pytest.mark.parametrize("path", TOML_FILES, ids=lambda p: p.name)
def test_every_figure_in_the_catalog_has_a_source(path: Path) -> None:
    with path.open("rb") as f:
        assert unsourced(tomllib.load(f), path.name) == []


def figure_keys(machine: Machine) -> set[str]:
    """The `sources` keys a machine must carry: every figure of every part, plus its own."""
    keys = {"ram_bytes"} | ({"price_usd"} if machine.price_usd is not None else set())
    parts = [("gpu", machine.gpu), ("link", machine.link), ("cpu", machine.cpu)]
    parts += [(f"nvme[{i}]", d) for i, d in enumerate(machine.nvme)]
    for prefix, part in parts:
        keys |= {
            f"{prefix}.{f.name}"
            for f in dataclasses.fields(part)
            if f.name != "name" and getattr(part, f.name) is not None  # optional figures
        }
    return keys


@pytest.mark.parametrize("name", machine_names())
def test_every_machine_preset_loads_with_every_figure_sourced(name: str) -> None:
    machine = load_machine(name)
    assert machine.name == name
    assert {key for key, _ in machine.sources} == figure_keys(machine)
    assert all(source.strip() for _, source in machine.sources)
    assert machine.cpu.adam_elems_per_s() > 0


def test_catalog_holds_the_required_parts_and_presets() -> None:
    gpus = {"rtx3090", "rtx4090", "rtx5090", "rx7900xt", "a100-40g", "a100-80g", "h100-sxm"}
    assert gpus | {"h200", "l40s"} <= set(gpu_names())
    assert {"ryzen9-9950x", "xeon-h200-host", "epyc-7543", "xeon-8480plus"} <= set(cpu_names())
    assert {"samsung-990-pro-2tb", "samsung-9100-pro-2tb", "local-disk-h200"} <= set(nvme_names())
    assert {"paper-pc-4090", "paper-server-a100", "h200-16c-128g"} <= set(machine_names())


def test_paper_pc_is_the_papers_platform() -> None:
    m = load_machine("paper-pc-4090")
    assert (m.gpu.name, m.cpu.name, m.link.name) == ("rtx4090", "ryzen9-9950x", "pcie4-x16")
    assert m.gpu.memory_bytes == 24 * GIB and m.cpu.cores == 16
    # Four DIMMs run at DDR5-3600, so the preset overrides the part's two-DIMM DDR5-5600 figure.
    assert m.cpu.dram_bytes_per_s == 43.2e9 and "DDR5-3600" in m.source("cpu.dram_bytes_per_s")


def test_h200_preset_reproduces_the_measured_cpu_rates() -> None:
    """The executor's own host update, calibrated from a lane thread (2026-11-30): 1.99e9 elem/s
    at its 12 threads, 1.36e9 at 6, 1.71e9 at 12 with both copy engines streaming."""
    cpu = load_machine("h200-16c-128g").cpu
    assert cpu.adam_elems_per_s(threads=12) == pytest.approx(1.99e9, rel=0.05)
    assert cpu.adam_elems_per_s(threads=6) == pytest.approx(1.36e9, rel=0.05)
    assert cpu.adam_elems_per_s(threads=12, dma_load=1.0) == pytest.approx(1.71e9, rel=0.05)
    # the DRAM left falls linearly with the share of full duplex DMA traffic beside the update
    half = cpu.adam_elems_per_s(threads=12, dma_load=0.5)
    assert half == pytest.approx((1.99e9 + 1.71e9) / 2, rel=0.05)
    with pytest.raises(ValueError, match="dma_load must be within"):
        cpu.adam_elems_per_s(dma_load=1.5)
    assert cpu.adam_elems_per_s() == cpu.adam_elems_per_s(threads=16)  # default: all cores
    # one DRAM figure per CPU, the update's: it caps the cast (probed alone at 12.2e9) at 55.8e9 / 6 B
    assert cpu.cast_elems_per_s(threads=16) == pytest.approx(55.81e9 / 6)


def test_h200_preset_carries_the_measured_gpu_and_link() -> None:
    m = load_machine("h200-16c-128g")
    assert m.gpu.bf16_matmul_tflops == 725.21 and m.gpu.memory_bytes == 143771 * 2**20
    assert (m.link.h2d_bytes_per_s, m.link.duplex_bytes_per_s) == (55.21e9, 49.18e9)
    assert m.gpu.lce_logits_per_s == 25.9e9 and m.gpu.adam_elems_per_s == 135.07e9
    assert m.ram_bytes == 125 * GIB and m.nvme[0].gds is False
    assert m.source("gpu.bf16_matmul_tflops").startswith(
        "measured: NVIDIA H200, 2026-11-30, slide calibrate"
    )


def make_cpu(**changes: object) -> Cpu:
    fields = dict(name="toy", cores=4, adam_elems_per_s_per_core=1e9, cast_elems_per_s_per_core=3e9,
                  dram_bytes_per_s=56e9, simd="avx2")  # fmt: skip
    return Cpu(**(fields | changes))  # type: ignore[arg-type]


def test_adam_rate_is_the_lesser_of_the_core_and_dram_bounds() -> None:
    cpu = make_cpu()
    assert cpu.adam_elems_per_s(threads=1) == 1e9  # core-bound
    assert cpu.adam_elems_per_s() == 2e9  # 4 cores want 4e9; DRAM allows 56e9 / 28
    assert cpu.adam_elems_per_s(bytes_per_elem=14) == 4e9  # bf16 grads touch fewer bytes
    assert cpu.adam_elems_per_s(threads=64) == cpu.adam_elems_per_s(threads=4)  # no extra cores
    assert cpu.cast_elems_per_s(threads=2) == 6e9 and cpu.cast_elems_per_s() == 56e9 / 6
    for bad in ({"threads": 0}, {"threads": 1.5}, {"bytes_per_elem": 0}):
        with pytest.raises(ValueError, match=r"threads|bytes_per_elem"):
            cpu.adam_elems_per_s(**bad)  # type: ignore[arg-type]


def test_ram_override() -> None:
    m = load_machine("paper-pc-4090", ram_gb=128)
    assert m.ram_bytes == 128 * GIB and "override" in m.source("ram_bytes")
    assert load_machine("paper-pc-4090", ram_gb=0.5).ram_bytes == GIB // 2
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="ram_gb"):
            load_machine("paper-pc-4090", ram_gb=bad)


def test_nvme_overrides(tmp_path: Path) -> None:
    m = load_machine("paper-pc-4090", nvme=3)
    assert [d.name for d in m.nvme] == ["samsung-990-pro-2tb"] * 3
    assert {key for key, _ in m.sources} == figure_keys(m)
    m = load_machine("paper-pc-4090", nvme=2, nvme_model="samsung-9100-pro-2tb")
    assert [d.name for d in m.nvme] == ["samsung-9100-pro-2tb"] * 2
    assert "14,700" in m.source("nvme[1].read_bytes_per_s")
    m = load_machine("h200-16c-128g", nvme_model="samsung-9100-pro-2tb")  # keeps the count
    assert [d.name for d in m.nvme] == ["samsung-9100-pro-2tb"]
    assert load_machine("h200-16c-128g", nvme=0).nvme == ()
    assert load_machine("h200-16c-128g", nvme=2).nvme[1].name == "local-disk-h200"
    bare = tmp_path / "bare.toml"
    bare.write_text('gpu = "l40s"\ncpu = "epyc-7543"\nram_gib = 64\nram_gib_source = "test"\n')
    assert load_machine(str(bare)).nvme == ()
    assert [d.name for d in load_machine(str(bare), nvme=1).nvme] == ["samsung-990-pro-2tb"]
    counted = tmp_path / "counted.toml"
    counted.write_text(
        bare.read_text() + 'nvme = [{ preset = "samsung-9100-pro-2tb", count = 3 }]\n'
    )
    assert [d.name for d in load_machine(str(counted)).nvme] == ["samsung-9100-pro-2tb"] * 3
    with pytest.raises(ValueError, match="nvme"):
        load_machine("paper-pc-4090", nvme=-1)
    assert with_drives(load_machine(str(bare)), 2) == load_machine(str(bare), nvme=2)
    with pytest.raises(UnknownHardwareError, match="samsung-990-pro-2tb"):
        load_machine("paper-pc-4090", nvme_model="samsung-990-pro")


def round_trip(machine: Machine, tmp_path: Path) -> Machine:
    path = tmp_path / f"{len(list(tmp_path.iterdir()))}.toml"
    path.write_text(machine_to_toml(machine), encoding="utf-8")
    return load_machine(str(path))


@pytest.mark.parametrize("name", machine_names())
def test_toml_round_trip_of_presets(name: str, tmp_path: Path) -> None:
    for machine in (load_machine(name), load_machine(name, ram_gb=77.7, nvme=2)):
        again = round_trip(machine, tmp_path)
        assert again == machine
        assert machine_to_toml(again) == machine_to_toml(machine)
        assert load_machine_toml(machine_to_toml(machine)) == machine


def test_toml_round_trip_is_exact_for_awkward_values(tmp_path: Path) -> None:
    base = load_machine("h200-16c-128g")
    gpu = dataclasses.replace(base.gpu, name='odd "name" \\ é \x7f', memory_bytes=10**11 + 7,
                              bf16_matmul_tflops=1 / 3 * 1000, hbm_bytes_per_s=4.8e12 / 7)  # fmt: skip
    link = dataclasses.replace(base.link, h2d_bytes_per_s=2.0 / 3.0 * 1e10)
    drive = dataclasses.replace(base.nvme[0], capacity_bytes=123_456_789_012)
    sources = dict(base.sources) | {"gpu.hbm_bytes_per_s": 'multi\nline "quoted"', "price_usd": "t"}
    machine = dataclasses.replace(base, gpu=gpu, link=link, nvme=(drive,), price_usd=0.1 + 0.2,
                                  ram_bytes=3 * GIB + 1, sources=sources)  # fmt: skip
    assert round_trip(machine, tmp_path) == machine


def test_machine_accepts_sources_as_a_mapping() -> None:
    m = load_machine("paper-server-a100")
    again = dataclasses.replace(m, sources=dict(m.sources))
    assert again == m and again.source("cpu.cores") == m.source("cpu.cores")


MACHINE_HEAD = 'gpu = "rtx4090"\ncpu = "ryzen9-9950x"\n'
RAM = 'ram_gib = 64\nram_gib_source = "test"\n'
BAD_MACHINES = {
    "missing figure": (MACHINE_HEAD, "ram_gib"),
    "figure without source": (MACHINE_HEAD + "ram_gib = 64\n", "ram_gib_source"),
    "wrong type": (MACHINE_HEAD + 'ram_gib = "lots"\nram_gib_source = "t"\n', "ram_gib"),
    "non-positive override": (
        'cpu = "ryzen9-9950x"\n' + RAM + '[gpu]\npreset = "rtx4090"\n'
        'bf16_matmul_tflops = -1.0\nbf16_matmul_tflops_source = "t"\n',
        "bf16_matmul_tflops",
    ),
    "override without its own source": (
        'gpu = "rtx4090"\n' + RAM + '[cpu]\npreset = "ryzen9-9950x"\ndram_gb_per_s = 30.0\n',
        "dram_gb_per_s_source",
    ),
    "unknown key": (MACHINE_HEAD + RAM + "ram_gbi = 3\n", "ram_gbi"),
    "inline part missing a figure": (
        'gpu = "rtx4090"\n' + RAM + '[cpu]\nname = "x"\ncores = 8\ncores_source = "t"\n',
        "adam_elems_per_s_per_core",
    ),
    "whole number": (
        'gpu = "rtx4090"\n' + RAM + '[cpu]\npreset = "epyc-7543"\ncores = 8.5\n'
        'cores_source = "t"\n',
        "cores",
    ),
    "missing gpu": ('cpu = "epyc-7543"\n' + RAM, "gpu"),
    "not TOML": ("gpu = \n", "not valid TOML"),
    "drives not a list": (MACHINE_HEAD + RAM + 'nvme = "samsung-990-pro-2tb"\n', "nvme"),
    "drive count": (
        MACHINE_HEAD + RAM + 'nvme = [{ preset = "local-disk-h200", count = 0 }]\n',
        "nvme count",
    ),
}


@pytest.mark.parametrize("case", BAD_MACHINES)
def test_config_errors_name_the_file_and_the_field(case: str, tmp_path: Path) -> None:
    text, field = BAD_MACHINES[case]
    path = tmp_path / "broken-machine.toml"
    path.write_text(text)
    with pytest.raises(HardwareConfigError) as error:
        load_machine(str(path))
    assert "broken-machine.toml" in str(error.value) and field in str(error.value)


def test_errors_in_a_catalog_part_name_its_file(tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(CATALOG / "hardware", tmp_path, dirs_exist_ok=True)
    gpus = tmp_path / "gpus.toml"
    gpus.write_text(gpus.read_text().replace("hbm_gb_per_s = 1008.0\n", ""))
    monkeypatch.setattr(hardware, "_PARTS_DIR", tmp_path)
    hardware._parts.cache_clear()
    try:
        with pytest.raises(HardwareConfigError, match=r"gpus\.toml \[rtx4090\] hbm_gb_per_s"):
            load_machine("paper-pc-4090")
    finally:
        hardware._parts.cache_clear()


def test_unknown_names_list_close_matches(tmp_path: Path) -> None:
    with pytest.raises(UnknownHardwareError) as error:
        load_machine("paper-pc-409")
    assert "paper-pc-4090" in str(error.value) and "slide machines" in str(error.value)
    path = tmp_path / "m.toml"
    path.write_text('gpu = "rtx4900"\ncpu = "epyc-7543"\n' + RAM)
    with pytest.raises(UnknownHardwareError, match="did you mean rtx4090"):
        load_machine(str(path))
    with pytest.raises(HardwareConfigError, match=r"<machine TOML> ram_gib"):
        load_machine_toml('gpu = "h200"\ncpu = "xeon-h200-host"\n')
    with pytest.raises(HardwareConfigError, match=r"nowhere\.toml"):
        load_machine(str(tmp_path / "nowhere.toml"))
    assert issubclass(UnknownHardwareError, ValueError)
    assert issubclass(HardwareConfigError, ValueError)


def test_parts_validate_their_fields() -> None:
    gpu = load_machine("h200-16c-128g").gpu
    with pytest.raises(ValueError, match=r"Gpu\.memory_bytes"):
        dataclasses.replace(gpu, memory_bytes=0)
    with pytest.raises(ValueError, match=r"Gpu\.memory_bytes .*whole"):
        dataclasses.replace(gpu, memory_bytes=1.5)
    with pytest.raises(ValueError, match=r"bf16_matmul_tflops must be <= 1\.5"):
        dataclasses.replace(gpu, bf16_matmul_tflops=2000.0)  # GFLOP/s written as TFLOP/s
    with pytest.raises(ValueError, match=r"Link\.duplex_bytes_per_s"):
        Link(name="l", h2d_bytes_per_s=1.0, d2h_bytes_per_s=1.0, duplex_bytes_per_s=float("inf"),
             pageable_h2d_bytes_per_s=1.0, pageable_d2h_bytes_per_s=1.0)  # fmt: skip
    with pytest.raises(ValueError, match=r"Cpu\.simd"):
        make_cpu(simd="")
    with pytest.raises(ValueError, match=r"Nvme\.gds"):
        Nvme(name="d", capacity_bytes=1, read_bytes_per_s=1.0, write_bytes_per_s=1.0, gds=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Machine\.price_usd"):
        dataclasses.replace(load_machine("paper-pc-4090"), price_usd=-5.0)
    with pytest.raises(ValueError, match=r"Machine\.gpu"):
        dataclasses.replace(load_machine("paper-pc-4090"), gpu=make_cpu())
    assert isinstance(gpu, Gpu)
