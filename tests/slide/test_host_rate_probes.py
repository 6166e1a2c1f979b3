"""The host-side calibration probes measure real work on the CPU: the host AdamW, the cast, the
drive and the host-update unit's cap by the host's RAM."""

from slide.calibration import host_rate_probes as cal
from slide_ir.specs.hardware import Nvme
from slide_ir.specs.hardware_parts import parse_grid


def test_cpu_probes_measure_positive_rates():
    adam = cal.adam_rate(threads=1, elements=1 << 20)
    cast = cal.cast_rate(threads=1, elements=1 << 20)
    assert adam.value > 1e6 and "1 threads" in adam.note
    assert cast.value > adam.value  # a copy is cheaper than an AdamW step


def test_nvme_probe_writes_and_reads_a_real_file(tmp_path):
    got = cal.nvme_rates(tmp_path, size_mb=32)
    assert got["read"].value > 0 and got["write"].value > 0
    assert list(tmp_path.iterdir()) == []  # the probe file is removed
    for way in ("read", "write"):  # the request curve: each grid size, then the transfer's own
        sizes = [dims for dims, _ in parse_grid(got[f"{way}_grid"].text, dims=1)]
        assert sizes == [(4096,), (256 << 10,), (16 << 20,), (32 << 20,)]
        assert Nvme(name="d", capacity_bytes=1, read_bytes_per_s=1, write_bytes_per_s=1, gds=False,
                    read_grid=got[f"{way}_grid"].text)  # fmt: skip


def test_the_host_update_grid_times_each_size_at_each_thread_count():
    grid = cal.adam_grid([1, 2], sizes=(1 << 16, 1 << 18))
    points = parse_grid(grid.text, dims=2)
    assert [dims for dims, _ in points] == [(1 << 16, 1), (1 << 16, 2), (1 << 18, 1), (1 << 18, 2)]
    assert all(rate > 1e-3 for _, rate in points)  # Gelem/s


def test_host_update_unit_is_a_layer_capped_by_the_hosts_ram():
    assert cal.host_update_unit(1000) == 1000
    huge = cal.host_update_unit(10**13)  # no host holds four such units
    assert huge * cal.ADAM_UNITS * cal.ADAM_BYTES_PER_ELEMENT <= cal.host_ram_bytes() // 8
