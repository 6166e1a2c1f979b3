"""The host side's size curves (copies, drive requests, the host AdamW) and their grids, against
hand-computed values."""

import math
from dataclasses import replace

import pytest

from slide_ir.ir.graph import Op, OpKind, Work
from slide_ir.planning.cost import CostModel
from slide_ir.planning.host_rates import (
    ADAM_CALL_S,
    COPY_LATENCY_S,
    NVME_REQUEST_S,
    LogLinear,
)
from slide_ir.planning.machine_rates import Efficiency
from slide_ir.planning.refit import refit_machine
from slide_ir.specs.hardware import (
    Cpu,
    Link,
    Nvme,
    load_machine,
    load_machine_toml,
    machine_to_toml,
)
from slide_ir.specs.hardware_parts import parse_grid

KIB, MIB = 1 << 10, 1 << 20
NO_LAUNCH = Efficiency(launch_s=0.0)
# Round host figures on a preset's GPU: pinned h2d / d2h 25 GB/s alone, 20 GB/s duplex; two
# drives reading 5 GB/s, writing 4 GB/s; 14 cores (10 update threads by the one rule) at 1e8
# AdamW elements/s each, DRAM 1e11 B/s.
_LINK = Link(name="l", h2d_bytes_per_s=25e9, d2h_bytes_per_s=25e9, duplex_bytes_per_s=20e9,
             pageable_h2d_bytes_per_s=10e9, pageable_d2h_bytes_per_s=10e9)  # fmt: skip
_CPU = Cpu(name="c", cores=14, adam_elems_per_s_per_core=1e8, cast_elems_per_s_per_core=5e8,
           dram_bytes_per_s=1e11, simd="avx2")  # fmt: skip
_DRIVE = Nvme(name="d", capacity_bytes=10**12, read_bytes_per_s=5e9, write_bytes_per_s=4e9,
              gds=False)  # fmt: skip
MACHINE = replace(load_machine("paper-pc-4090"), link=_LINK, cpu=_CPU, nvme=(_DRIVE, _DRIVE))


def _op(kind, lane, **work):
    return Op(id="x", kind=kind, lane=lane, step=1, unit=1, work=Work(**work))


def _seconds(machine, op, **kw):
    return CostModel(machine, efficiency=NO_LAUNCH, **kw).seconds(op)


def test_a_preset_prices_each_host_op_by_its_size_on_the_derived_curve():
    # a copy: 10 us, then bytes at the duplex rate; 4 KiB is all latency, 1 GiB all rate
    for size in (4 * KIB, MIB, 1 << 30):
        up = _op(OpKind.H2D_PARAM, "h2d", bytes=size)
        assert _seconds(MACHINE, up) == pytest.approx(COPY_LATENCY_S + size / 20e9)
    assert 4 * KIB / _seconds(MACHINE, _op(OpKind.D2H_GRAD, "d2h", bytes=4 * KIB)) < 0.5e9
    # a drive request: 90 us, then bytes at the drive's rate (a 4 KiB read: ~45 MB/s)
    read = _op(OpKind.NVME_READ, "nvme0", bytes=4 * KIB)
    assert _seconds(MACHINE, read) == pytest.approx(NVME_REQUEST_S + 4096 / 5e9)
    write = _op(OpKind.NVME_WRITE, "nvme1", bytes=16 * MIB)
    assert _seconds(MACHINE, write) == pytest.approx(NVME_REQUEST_S + 16 * MIB / 4e9)
    # the host AdamW: 30 us a call, then elements at 10 threads x 1e8 (under 1e11 / 28)
    adam = _op(OpKind.ADAM, "cpu", elements=MIB, bytes=28 * MIB)
    assert _seconds(MACHINE, adam) == pytest.approx(ADAM_CALL_S + MIB / 1e9)
    assert _seconds(MACHINE, _op(OpKind.H2D_PARAM, "h2d")) == 0.0  # nothing to move: no cost


def test_the_fixed_costs_are_what_no_rate_scales():
    cm = CostModel(MACHINE, efficiency=Efficiency(launch_s=1e-5))
    up = _op(OpKind.H2D_PARAM, "h2d", bytes=MIB)
    assert cm.fixed_seconds(up) == pytest.approx(1e-5 + COPY_LATENCY_S)
    adam = _op(OpKind.ADAM, "cpu", elements=MIB, bytes=28 * MIB)
    assert cm.fixed_seconds(adam) == pytest.approx(1e-5 + ADAM_CALL_S)
    read = _op(OpKind.NVME_READ, "nvme0", bytes=MIB)
    assert cm.fixed_seconds(read) == pytest.approx(1e-5 + NVME_REQUEST_S)


def _with_grids(**link):
    return replace(MACHINE, link=replace(MACHINE.link, **link))


# Pinned h2d measured at 64 KiB (2.5 GB/s) and 16 MiB (20 GB/s): measured / curve time there
R_SMALL = (64 * KIB / 2.5e9) / (COPY_LATENCY_S + 64 * KIB / 25e9)
R_LARGE = (16 * MIB / 20e9) / (COPY_LATENCY_S + 16 * MIB / 25e9)
H2D_GRID = "65536:2.5 16777216:20"


@pytest.mark.parametrize(
    ("size", "factor"),
    [
        (64 * KIB, R_SMALL),  # a grid point: exactly the measured / curve ratio
        (16 * MIB, R_LARGE),
        (MIB, math.sqrt(R_SMALL * R_LARGE)),  # halfway in log2 size: the geometric mean
        (4 * KIB, R_SMALL),  # beyond the ends: the nearest end's ratio
        (1 << 30, R_LARGE),
    ],
)
def test_a_copy_grid_corrects_the_curve_at_the_measured_sizes(size, factor):
    machine = _with_grids(h2d_grid=H2D_GRID)
    up = _op(OpKind.ACT_LOAD, "h2d", bytes=size)
    assert _seconds(machine, up) == pytest.approx(factor * (COPY_LATENCY_S + size / 20e9))
    down = _op(OpKind.ACT_SAVE, "d2h", bytes=size)  # the other direction keeps its own curve
    assert _seconds(machine, down) == pytest.approx(COPY_LATENCY_S + size / 20e9)


def test_an_adam_grid_interpolates_in_size_and_threads():
    """Points at 1M and 16M elements, 5 and 10 threads; the plan runs 10 (or 7) threads."""
    cpu = MACHINE.cpu

    def ratio(n, t, measured):  # measured Gelem/s against the curve at (n, t)
        return (n / (measured * 1e9)) / (ADAM_CALL_S + n / min(t * 1e8, 1e11 / 28))

    grid = {(MIB, 5): 0.4, (16 * MIB, 5): 0.5, (MIB, 10): 0.6, (16 * MIB, 10): 0.9}
    text = " ".join(f"{n}x{t}:{v}" for (n, t), v in grid.items())
    machine = replace(MACHINE, cpu=replace(cpu, adam_grid=text))
    r = {k: ratio(*k, v) for k, v in grid.items()}
    adam = _op(OpKind.ADAM, "cpu", elements=4 * MIB, bytes=28 * 4 * MIB)
    curve = ADAM_CALL_S + 4 * MIB / 1e9
    at_10 = math.sqrt(r[MIB, 10] * r[16 * MIB, 10])  # 4M: halfway between 1M and 16M
    assert _seconds(machine, adam) == pytest.approx(at_10 * curve)
    at_5 = math.sqrt(r[MIB, 5] * r[16 * MIB, 5])
    w = math.log2(7 / 5) / math.log2(10 / 5)  # 7 threads: that far from 5 towards 10
    seven = ADAM_CALL_S + 4 * MIB / 7e8
    want = math.exp((1 - w) * math.log(at_5) + w * math.log(at_10)) * seven
    assert _seconds(machine, adam, cpu_threads=7) == pytest.approx(want)


def test_a_drive_grid_corrects_that_drives_requests():
    drive = replace(MACHINE.nvme[1], read_grid="4096:0.02")  # 4 KiB reads at 20 MB/s
    machine = replace(MACHINE, nvme=(MACHINE.nvme[0], drive))
    ratio = (4096 / 0.02e9) / (NVME_REQUEST_S + 4096 / 5e9)
    small = _op(OpKind.NVME_READ, "nvme1", bytes=4096)
    assert _seconds(machine, small) == pytest.approx(4096 / 0.02e9)
    big = _op(OpKind.NVME_READ, "nvme1", bytes=64 * MIB)
    assert _seconds(machine, big) == pytest.approx(ratio * (NVME_REQUEST_S + 64 * MIB / 5e9))
    other = _op(OpKind.NVME_READ, "nvme0", bytes=4096)
    assert _seconds(machine, other) == pytest.approx(NVME_REQUEST_S + 4096 / 5e9)


def test_a_profile_without_the_curves_loads_and_prices_by_the_derived_defaults():
    machine = _with_grids(h2d_grid=H2D_GRID, d2h_grid="1048576:10")
    machine = replace(machine, cpu=replace(machine.cpu, adam_grid="1048576x10:0.5"))
    text = machine_to_toml(machine)
    old = "\n".join(line for line in text.splitlines() if "_grid" not in line)
    loaded = load_machine_toml(old)
    assert (loaded.link.h2d_grid, loaded.link.d2h_grid, loaded.cpu.adam_grid) == (None,) * 3
    assert loaded == replace(machine, link=MACHINE.link, cpu=MACHINE.cpu, sources=loaded.sources)
    up = _op(OpKind.H2D_PARAM, "h2d", bytes=MIB)
    assert _seconds(loaded, up) == pytest.approx(COPY_LATENCY_S + MIB / 20e9)
    again = load_machine_toml(text)  # and the grids round-trip where present
    assert (again.link, again.cpu) == (machine.link, machine.cpu)


def test_a_bad_host_grid_point_is_refused_naming_itself():
    with pytest.raises(ValueError, match="bad grid point '4x4:1': expected 1 dims"):
        replace(MACHINE.link, h2d_grid="4x4:1")
    with pytest.raises(ValueError, match="expected 2 dims"):
        replace(MACHINE.cpu, adam_grid="1048576:2")
    assert isinstance(replace(MACHINE.link, d2h_grid="4096:0.3 65536:3"), Link)


def test_a_refit_moves_each_curve_with_its_lanes_rate():
    """Measured 2x slow, the h2d lane's rates halve and its grid moves with them: every upload
    then takes its fixed part (as `fixed_seconds` says) + twice the rest, at any size."""
    machine = _with_grids(h2d_grid=H2D_GRID)
    fitted = refit_machine(machine, {"h2d": 2.0})
    for (size, rate), (_, moved), ratio in zip(
        parse_grid(H2D_GRID), parse_grid(fitted.link.h2d_grid), (R_SMALL, R_LARGE), strict=True
    ):
        fixed = ratio * COPY_LATENCY_S  # at 64 KiB 20.8 of the point's 26.2 us; at 16 MiB 12 us
        seconds = size[0] / (rate * 1e9)
        assert moved == pytest.approx(size[0] / (fixed + 2 * (seconds - fixed)) / 1e9, rel=1e-3)
    assert fitted.link.d2h_grid is None  # a lane without a grid keeps none
    before = CostModel(machine, efficiency=NO_LAUNCH)
    after = CostModel(fitted, efficiency=NO_LAUNCH)
    for size in (4 * KIB, 64 * KIB, MIB, 16 * MIB, 1 << 30):
        up = _op(OpKind.H2D_PARAM, "h2d", bytes=size)
        fixed = before.fixed_seconds(up)
        assert after.fixed_seconds(up) == pytest.approx(fixed, rel=1e-3)
        assert after.seconds(up) == pytest.approx(
            fixed + 2 * (before.seconds(up) - fixed), rel=1e-3
        )
    assert "re-fit" in fitted.source("link.h2d_grid")


def test_log_linear_holds_its_ends_and_is_exact_at_points():
    f = LogLinear([((4,), 1.0), ((16,), 3.0)])
    assert [f.at((d,)) for d in (1, 4, 8, 16, 64)] == [1.0, 1.0, 2.0, 3.0, 3.0]
    two = LogLinear([((4, 2), 1.0), ((4, 8), 5.0)])  # one size, two thread counts
    assert two.at((100, 4)) == pytest.approx(3.0)


def test_a_tiny_models_host_updates_count_as_fixed_cost_for_the_refit():
    """tiny-llama's units update in microseconds: the update call's fixed cost is most of its
    cpu lane, so a re-fit leaves that lane's rates alone (`refit.MAX_FIXED_SHARE`); an 8B
    model's cpu lane is its rates."""
    from slide_ir.planning.planner import plan
    from slide_ir.planning.refit import MAX_FIXED_SHARE, fixed_shares
    from slide_ir.specs.config import TrainConfig
    from slide_ir.specs.model_catalog import load_model

    preset = load_machine("h200-16c-128g")
    for model, fixed_bound in (("tiny-llama", True), ("llama-3.1-8b", False)):
        p = plan(load_model(model), preset, TrainConfig(batch=2, seq=64, resident=0, streamed=0))
        assert (fixed_shares(p, {2})["cpu"] >= MAX_FIXED_SHARE) == fixed_bound, model
