"""`--machine auto`: the per-host profile cache (keying, refresh by `slide calibrate`, a corrupt
entry measured again) and planning with the cached figures. The probes are replaced by functions
that return known figures and the host by a fixed description, so no GPU is needed."""

import logging
from dataclasses import replace

import pytest
import torch

from slide.calibration import auto_machine, gpu_probes, host_probes, host_rate_probes, shape_probes
from slide.calibration import probe_common as cal
from slide.cli import main
from slide.train_prepare import resolve_machine
from slide.train_request import TrainRequest
from slide_ir.planning.planner import plan
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine, load_machine_toml, machine_to_toml
from slide_ir.specs.hardware_parts import default_optimizer_threads
from slide_ir.specs.model_catalog import load_model

HOST = host_probes.Host(
    gpu="NVIDIA Imaginary X1", gpu_memory_bytes=48 << 30, cpu="Made-up CPU 9000", cores=16,
    ram_bytes=(256 << 30) + 12345,
)  # fmt: skip
CUDA = torch.device("cuda")  # never touched: `this_host` is replaced below


def _fig(value: float, threads: int = 0) -> cal.Figure:
    return cal.Figure(value, "fake probe", threads)


ADAM_PER_CORE = 1.5e8  # what the fake half-thread host-update probe reports, per thread
FLOORS = {"fwd": _fig(9e-4), "bwd": _fig(1.5e-3), "loss": _fig(1.4e-3)}  # seconds
COPY_GRID = cal.GridFigure("65536:4 1048576:30", "fake probe", 2)  # the host curves' points
ADAM_GRID = cal.GridFigure("1048576x6:1.1 1048576x12:1.6", "fake probe", 2)
NVME_GRID = cal.GridFigure("4096:0.05", "fake probe", 1)


class FakeProbes:
    """Stands in for the calibration's probes (`gpu_probes`, `host_rate_probes`); `scale` multiplies every rate, `calls`
    counts the runs of the host-update probe (three per measurement)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scale, self.calls = 1.0, 0
        rates = {(gpu_probes, "matmul_rate"): 500e12, (gpu_probes, "attention_rate"): 200e12,
                 (gpu_probes, "masked_attention_rate"): 80e12,
                 (gpu_probes, "hbm_rate"): 3e12, (gpu_probes, "lce_rate"): 2e10,
                 (gpu_probes, "elementwise_rate"): 2e12, (gpu_probes, "gpu_adam_rate"): 5e10,
                 (host_rate_probes, "cast_rate"): 4e9}  # fmt: skip
        for (module, name), value in rates.items():
            monkeypatch.setattr(module, name, lambda *a, _v=value, **k: _fig(_v * self.scale))
        monkeypatch.setattr(host_rate_probes, "link_rates", self.link)
        monkeypatch.setattr(gpu_probes, "dispatch_floors", lambda *a, **k: dict(FLOORS))
        monkeypatch.setattr(host_rate_probes, "adam_rate", self.adam)
        monkeypatch.setattr(host_rate_probes, "adam_grid", lambda threads: ADAM_GRID)
        drive = {"read": _fig(7e9), "write": _fig(6e9), "read_grid": NVME_GRID,
                 "write_grid": NVME_GRID}  # fmt: skip
        monkeypatch.setattr(host_rate_probes, "nvme_rates", lambda d, *a: drive)
        monkeypatch.setattr(host_probes, "this_host", lambda device: HOST)
        grid = shape_probes.GridFigure("8192x4096x4096:480 1024x896x896:150", "fake probe", 2)
        monkeypatch.setattr(shape_probes, "gemm_grid_rates", lambda: grid)
        attention = shape_probes.GridFigure("4x32x2048x128:190", "fake probe", 1)
        monkeypatch.setattr(shape_probes, "attention_grid_rates", lambda: attention)

    def link(self, *args: object) -> dict[str, object]:
        keys = ("h2d", "d2h", "duplex", "pageable_h2d", "pageable_d2h")
        return {k: _fig(5e10 * self.scale) for k in keys} | {
            "h2d_grid": COPY_GRID,
            "d2h_grid": COPY_GRID,
        }

    def adam(self, threads: int, elements: int = 0, **kw: object) -> cal.Figure:
        self.calls += 1
        return cal.Figure(threads * ADAM_PER_CORE * self.scale, "fake probe", threads, elements)


@pytest.fixture
def probes(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return FakeProbes(monkeypatch)


def _request(**kw: object) -> TrainRequest:
    return TrainRequest(
        model="llama-3.2-3b", machine="auto", config=TrainConfig(batch=4, seq=256), **kw
    )


def test_keys_tell_hosts_apart_and_agree_on_the_same_host():
    assert HOST.key == replace(HOST).key
    assert HOST.key == replace(HOST, ram_bytes=HOST.ram_bytes + (5 << 20)).key  # boot-to-boot
    others = [replace(HOST, gpu="NVIDIA H200"), replace(HOST, cpu="Other CPU 9000"),
              replace(HOST, cores=8), replace(HOST, ram_bytes=128 << 30),
              replace(HOST, gpu_memory_bytes=24 << 30)]  # fmt: skip
    keys = {HOST.key, *(h.key for h in others)}
    assert len(keys) == 1 + len(others)
    assert all("/" not in k and " " not in k for k in keys)
    assert HOST.key.startswith("nvidia-imaginary-x1-48g--made-up-cpu-9000-16c-256g--")


def test_auto_measures_once_then_reads_the_cache(probes):
    first = auto_machine.auto_machine(CUDA)
    assert probes.calls == 3 and auto_machine.cache_path(HOST).exists()
    probes.scale = 2.0  # a second measurement would differ: the cache must be what is read
    second = auto_machine.auto_machine(CUDA)
    assert probes.calls == 3 and second == first
    assert first.name == "auto (NVIDIA Imaginary X1)"
    assert first.gpu.bf16_matmul_tflops == 500 and first.gpu.memory_bytes == HOST.gpu_memory_bytes
    assert (
        first.cpu.adam_elems_per_s_per_core == ADAM_PER_CORE and first.ram_bytes == HOST.ram_bytes
    )
    assert "slide train --machine auto" in first.source("cpu.dram_bytes_per_s")
    assert (first.gpu.layer_fwd_floor_s, first.gpu.layer_bwd_floor_s, first.gpu.loss_floor_s) == (
        9e-4,
        1.5e-3,
        1.4e-3,
    )  # and read back from the cache's TOML as they were measured (second == first)
    assert "fake probe" in first.source("gpu.layer_bwd_floor_s")


def test_an_unknown_gpu_is_measured_not_given_a_presets_figures(probes):
    machine = auto_machine.auto_machine(CUDA)
    for preset in ("paper-pc-4090", "h200-16c-128g"):
        assert machine.gpu.bf16_matmul_tflops != load_machine(preset).gpu.bf16_matmul_tflops
    assert machine.gpu.bf16_peak_tflops == 500  # no datasheet: the measured rate
    assert "no datasheet match" in machine.source("gpu.bf16_peak_tflops")


def test_calibrate_refreshes_the_entry_auto_reads(probes, tmp_path, monkeypatch, capsys):
    auto_machine.auto_machine(CUDA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    probes.scale = 3.0
    out = tmp_path / "m.toml"
    args = ["calibrate", "--model", "llama-3.2-3b", "--nvme-dir", str(tmp_path), "--out", str(out)]
    assert main(args) == 0
    assert "cached as" in capsys.readouterr().out
    calibrated, after = load_machine(str(out)), auto_machine.auto_machine(CUDA)
    assert probes.calls == 6  # calibrate measured; auto then read what it wrote
    assert after.gpu.bf16_matmul_tflops == 1500 == calibrated.gpu.bf16_matmul_tflops
    assert after.cpu == calibrated.cpu and after.link == calibrated.link
    assert "slide calibrate" in after.source("link.h2d_bytes_per_s")
    assert len(calibrated.nvme) == 1 and after.nvme == ()  # a run names its own drives


@pytest.mark.parametrize("damage", ["not toml [[[", "name = 'half a profile'\n", b"\xff\xfe\x00"])
def test_a_corrupt_entry_is_measured_again_with_one_warning(probes, caplog, damage):
    path = auto_machine.cache_path(HOST)
    path.parent.mkdir(parents=True)
    path.write_bytes(damage.encode() if isinstance(damage, str) else damage)
    with caplog.at_level(logging.WARNING, logger="slide.calibration.auto_machine"):
        machine = auto_machine.auto_machine(CUDA)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unusable" in warnings[0].getMessage()
    assert probes.calls == 3 and machine.gpu.bf16_matmul_tflops == 500
    assert load_machine_toml(path.read_text()).cpu == machine.cpu  # the entry is whole again


def test_an_unwritable_cache_is_warned_about_and_the_run_goes_on(
    probes, caplog, tmp_path, monkeypatch
):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the directory should be
    with caplog.at_level(logging.WARNING, logger="slide.calibration.auto_machine"):
        machine = auto_machine.auto_machine(CUDA)
    assert machine.gpu.bf16_matmul_tflops == 500
    assert "cannot cache" in caplog.text


def test_auto_plans_with_the_cached_figures(probes):
    spec = load_model("llama-3.2-3b")
    machine = resolve_machine(_request(), CUDA)
    probes.scale = 10.0  # the cached figures, not these, must reach the planner
    again = resolve_machine(_request(), CUDA)
    the_plan = plan(spec, again, TrainConfig(batch=4, seq=256))
    assert the_plan.machine == machine
    assert the_plan.machine.link.h2d_bytes_per_s == 5e10
    assert the_plan.machine.cpu.adam_elems_per_s_per_core == ADAM_PER_CORE


def test_overrides_apply_to_the_measured_machine(probes):
    machine = resolve_machine(_request(ram_gb=64, nvme=2), CUDA)
    assert machine.ram_bytes == 64 << 30 and "override" in machine.source("ram_bytes")
    assert len(machine.nvme) == 2 and machine.gpu.bf16_matmul_tflops == 500


def test_cpu_mode_keeps_the_preset_figures_and_measures_nothing(probes):
    machine = resolve_machine(_request(ram_gb=8), torch.device("cpu"))
    preset = load_machine(auto_machine.CPU_MODE_PRESET)
    assert probes.calls == 0 and machine.name == "auto (cpu)"
    assert machine.gpu.bf16_matmul_tflops == preset.gpu.bf16_matmul_tflops
    assert (
        machine.ram_bytes == 8 << 30
        and machine.gpu.memory_bytes == host_rate_probes.host_ram_bytes()
    )
    assert not auto_machine.cache_dir().exists()


def test_probes_over_their_budget_are_warned_about(caplog):
    with caplog.at_level(logging.INFO, logger="slide.calibration.host_probes"):
        got = host_probes.run_probes({"a": lambda: 1, "b": lambda: 2}, budget_s=0.0)
    assert got == {"a": 1, "b": 2} and "over their 0 s budget" in caplog.text


def test_a_runs_refit_is_kept_for_later_runs_of_its_shape(probes):
    """A run that re-fit its profile (cpu lane measured 2x slow) leaves its factors beside the
    cache: the next run of that shape plans with them, without measuring again; a run of another
    shape, and the profile file itself, keep the probes' figures."""
    shape, other = auto_machine.refit_key("m", 4, 128), auto_machine.refit_key("m", 16, 1024)
    first = auto_machine.auto_machine(CUDA)
    profile = auto_machine.cache_path(HOST).read_text()
    assert auto_machine.refit_cache(CUDA, {"cpu": 2.0}, shape) == auto_machine.refits_path(HOST)
    again = auto_machine.auto_machine(CUDA, shape=shape)
    assert again.cpu.adam_elems_per_s_per_core == first.cpu.adam_elems_per_s_per_core / 2
    assert again.gpu == first.gpu and again.link == first.link
    assert "re-fit" in again.source("cpu.adam_elems_per_s_per_core")
    assert auto_machine.auto_machine(CUDA, shape=other).cpu == first.cpu
    assert auto_machine.auto_machine(CUDA).cpu == first.cpu
    assert auto_machine.cache_path(HOST).read_text() == profile
    assert probes.calls == 3  # measured once
    auto_machine.refit_cache(CUDA, {"layer_fwd_floor_s": 1.5}, other)  # a floor-bound run's
    floored = auto_machine.auto_machine(CUDA, shape=other)
    assert floored.gpu.layer_fwd_floor_s == pytest.approx(1.5 * first.gpu.layer_fwd_floor_s)
    assert floored.gpu.layer_bwd_floor_s == first.gpu.layer_bwd_floor_s
    assert floored.gpu.bf16_matmul_tflops == first.gpu.bf16_matmul_tflops
    assert auto_machine.auto_machine(CUDA, shape=shape).cpu == again.cpu  # both kept


def test_unreadable_refits_are_warned_about_and_ignored(probes, caplog):
    first = auto_machine.auto_machine(CUDA)
    auto_machine.refits_path(HOST).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="slide.calibration.auto_machine"):
        machine = auto_machine.auto_machine(CUDA, shape=auto_machine.refit_key("m", 1, 8))
    assert machine.cpu == first.cpu and "re-fits" in caplog.text and "unusable" in caplog.text


def test_plan_and_simulate_take_auto_as_train_does(probes, monkeypatch, capsys):
    """`slide plan --machine auto` plans on the profile `slide train` measured and cached on this
    host (no second measurement); on a host without CUDA it is refused with what to name."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    resolve_machine(_request(), CUDA)
    measured = probes.calls
    for command in ("plan", "simulate"):
        assert main([command, "--model", "llama-3.2-3b", "--machine", "auto", "--batch", "4"]) == 0
        assert f"on auto ({HOST.gpu})" in capsys.readouterr().out
    assert probes.calls == measured
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["plan", "--model", "llama-3.2-3b", "--machine", "auto"]) == 2
    err = capsys.readouterr().err
    assert "--machine auto" in err and "no CUDA GPU" in err and "slide machines" in err


def test_an_entry_of_an_older_profile_version_is_measured_again(probes, monkeypatch):
    """A cache entry written before the shape grids is never read (its key names its version):
    the host is measured again and the new entry holds the grids."""
    version = host_probes.PROFILE_VERSION
    host_probes.PROFILE_VERSION = version - 1
    try:
        old = auto_machine.cache_path(HOST)
    finally:
        host_probes.PROFILE_VERSION = version
    old.parent.mkdir(parents=True)
    old.write_text(machine_to_toml(load_machine("h200-16c-128g")))
    assert auto_machine.cached(HOST) is None
    machine = auto_machine.auto_machine(CUDA)
    assert probes.calls == 3 and machine.gpu.gemm_grid and machine.gpu.attention_grid
    assert machine.link.h2d_grid == COPY_GRID.text and machine.link.d2h_grid == COPY_GRID.text
    assert auto_machine.cache_path(HOST) != old and old.exists()  # never deleted: Slide's own


def test_the_host_curves_grids_hold_the_whole_unit_runs_as_points(probes):
    """The host update's grid: the grid probe's small units and the two whole-unit runs (all
    and half the update threads) that also give the per-core and DRAM figures."""
    machine = auto_machine.auto_machine(CUDA)
    unit = min(host_rate_probes.host_update_unit(load_model("llama-3.1-8b").layer_params), 64 << 20)
    threads = default_optimizer_threads(host_probes.usable_cores())  # as the probes run them
    counts = sorted({max(1, threads // 2), threads})
    runs = [f"{unit}x{t}:{t * ADAM_PER_CORE / 1e9:.4g}" for t in counts]
    assert machine.cpu.adam_grid == " ".join([ADAM_GRID.text, *runs])
    assert "each size" not in machine.source("cpu.adam_grid")  # the fake's own note
    assert "whole unit" in machine.source("cpu.adam_grid")


def test_each_nvme_dir_drive_is_measured_once_and_planned_with(probes, monkeypatch, tmp_path):
    """`--machine auto --nvme-dir D`: D's drive at its measured rates (not a catalog drive's
    datasheet), measured the first time its filesystem is seen and read back after; its free
    space is read each time. Two directories on one filesystem are two drives of that kind."""
    calls = []
    real = host_rate_probes.nvme_rates

    def counted(directory, *args):
        calls.append(directory)
        return real(directory, *args)

    monkeypatch.setattr(host_rate_probes, "nvme_rates", counted)
    monkeypatch.setattr(
        auto_machine, "auto_machine", lambda device, **kw: load_machine("h200-16c-128g")
    )
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    machine = auto_machine.resolve("auto", CUDA, nvme_dirs=[str(d) for d in dirs])
    assert len(calls) == 1 and auto_machine.drive_cache_path(dirs[0]).exists()
    assert [(d.read_bytes_per_s, d.write_bytes_per_s) for d in machine.nvme] == [(7e9, 6e9)] * 2
    assert machine.nvme[0].read_grid == NVME_GRID.text and not machine.nvme[0].gds
    source = dict(machine.sources)["nvme[1].read_gb_per_s"]
    assert source.startswith(f"measured: {dirs[0]}") and "fake probe" in source
    again = auto_machine.resolve("auto", CUDA, nvme_dirs=[str(dirs[1])])
    assert len(calls) == 1 and again.nvme == machine.nvme[:1]
    cpu_mode = auto_machine.resolve("auto", torch.device("cpu"), nvme=1, nvme_dirs=[str(dirs[0])])
    assert len(calls) == 1 and cpu_mode.nvme[0].name != "measured-drive"
