"""The host side's size curves measured on this machine, against what the cost model prices.

    python -m bench.speed.host_curves [--machine h200-16c-128g] [--nvme-dir /mnt/nvme/tmp]
                                      [--link-mb 1024] [--out curves.jsonl]

Three curves, each through the calibration's own probes (`slide.calibration.host_rate_probes`)
at wider grids than `slide calibrate` takes: pinned copies each way from 4 KiB to `--link-mb`
(CUDA events); the executor's host AdamW from a lane thread at unit sizes 64K-16M elements and
the probe's 64M, at 1, half and all of the update threads; with `--nvme-dir`, one request at a
time through the executor's own drive store (kvikio or O_DIRECT) from 4 KiB to 128 MiB.

Each row prints the measured rate, the preset's derived curve (`slide_ir.planning.host_rates`:
an uncalibrated machine's price) and the curve corrected by the few points `slide calibrate`
and `--machine auto` measure (`COPY_GRID`, `ADAM_GRID`, `NVME_GRID` and the probe's own size),
interpolated to the rest: the errors say how well both predict the sizes no probe took. Without
CUDA the copy rows are left out (the AdamW and drive rows run on any host).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from slide.calibration import host_rate_probes as cal
from slide.calibration.host_probes import usable_cores
from slide_ir.planning.host_rates import SizeCurve
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.hardware_parts import default_optimizer_threads, format_grid, parse_grid

KIB, MIB = 1 << 10, 1 << 20
COPY_SIZES = (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB)
ADAM_SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23, 1 << 24)
ADAM_UNIT = 64 * MIB  # the `--machine auto` probe's unit
NVME_SIZES = (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB)


def rows(
    curve: str,
    measured: str,
    part: Any,
    field: str,
    own_rate: Callable[[tuple[int, ...]], float],
    probe_sizes: Iterable[int],
) -> list[dict[str, Any]]:
    """One row per measured point of `measured` (a grid string): its rate, the preset `part`'s
    derived curve there and the curve corrected by the probe's own points alone."""
    points = parse_grid(measured)
    probe = {s for s in probe_sizes} | {max(d[0] for d, _ in points)}
    subset = format_grid((d, r) for d, r in points if d[0] in probe)
    preset = SizeCurve(replace(part, **{field: None}), field)
    probed = SizeCurve(replace(part, **{field: subset}), field)
    out = []
    for dims, rate in points:
        size, want = dims[0], rate * 1e9
        row = {"curve": curve, "dims": list(dims), "measured_per_s": want}
        for name, c in (("preset", preset), ("probed", probed)):
            predicted = size / c.seconds(dims, own_rate(dims))
            row[f"{name}_per_s"], row[f"{name}_error"] = predicted, predicted / want - 1
        row["probe_point"] = size in probe
        out.append(row)
    return out


def copy_rows(machine: Any, link_mb: int) -> list[dict[str, Any]]:
    got = cal.link_rates(link_mb, grid=COPY_SIZES)
    link = machine.link
    return [
        *rows("h2d", got["h2d_grid"].text, link, "h2d_grid",
              lambda _: link.h2d_bytes_per_s, cal.COPY_GRID),
        *rows("d2h", got["d2h_grid"].text, link, "d2h_grid",
              lambda _: link.d2h_bytes_per_s, cal.COPY_GRID),
    ]  # fmt: skip


def adam_rows(machine: Any, threads: Sequence[int]) -> list[dict[str, Any]]:
    small = parse_grid(cal.adam_grid(threads, sizes=ADAM_SIZES).text)
    whole = [((ADAM_UNIT, t), cal.adam_rate(t, ADAM_UNIT).value / 1e9) for t in threads]
    cpu = machine.cpu
    return rows("adam", format_grid([*small, *whole]), cpu, "adam_grid",
                lambda d: float(cpu.adam_elems_per_s(threads=d[1])), cal.ADAM_GRID)  # fmt: skip


def nvme_rows(machine: Any, directory: Path) -> list[dict[str, Any]]:
    got = cal.nvme_rates(directory, size_mb=1024, grid=NVME_SIZES)
    drive = machine.nvme[0]
    return [
        *rows("nvme_read", got["read_grid"].text, drive, "read_grid",
              lambda _: drive.read_bytes_per_s, cal.NVME_GRID),
        *rows("nvme_write", got["write_grid"].text, drive, "write_grid",
              lambda _: drive.write_bytes_per_s, cal.NVME_GRID),
    ]  # fmt: skip


def table(measured: Sequence[dict[str, Any]]) -> str:
    head = f"{'curve':<11}{'size':>12}{'thr':>5}{'measured':>11}{'preset':>10}{'err':>8}"
    lines = [head + f"{'probed':>10}{'err':>8}", "-" * len(head + " " * 18)]
    for r in measured:
        dims = r["dims"]
        thr = str(dims[1]) if len(dims) > 1 else ""
        mark = "*" if r["probe_point"] else " "
        lines.append(
            f"{r['curve']:<11}{dims[0]:>12}{thr:>5}{r['measured_per_s'] / 1e9:>10.3f}{mark}"
            f"{r['preset_per_s'] / 1e9:>10.3f}{r['preset_error']:>+8.1%}"
            f"{r['probed_per_s'] / 1e9:>10.3f}{r['probed_error']:>+8.1%}"
        )
    lines.append("rates in G/s (bytes; elements for adam); * a point the calibration probes take")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="h200-16c-128g", help="the preset to price with")
    parser.add_argument("--nvme-dir", type=Path, help="a directory on the drive to measure")
    parser.add_argument("--link-mb", type=int, default=1024)
    parser.add_argument("--out", type=Path, help="also write the rows here, one JSON a line")
    args = parser.parse_args(argv)
    machine = load_machine(args.machine)
    threads = default_optimizer_threads(usable_cores())  # the executor's, on this host
    measured = adam_rows(machine, sorted({1, max(1, threads // 2), threads}))
    if torch.cuda.is_available():
        measured = copy_rows(machine, args.link_mb) + measured
    else:
        print("no CUDA: the copy curves are left out", file=sys.stderr)
    if args.nvme_dir is not None and machine.nvme:
        measured += nvme_rows(machine, args.nvme_dir)
    print(f"{args.machine}, {threads} update threads, torch {torch.__version__}")
    print(table(measured))
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in measured), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
