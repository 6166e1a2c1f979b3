"""`--machine auto`: this host's own measured profile, measured once and then cached.

On CUDA the first run on a host runs `host_probes` at their `AUTO` sizes (the host AdamW as the
cpu lane runs it, link rates each way and duplex, the GPU's matmul, attention, memory, LCE,
elementwise and AdamW rates; ~20 s), writes the profile to

    $XDG_CACHE_HOME/slide/machines/<Host.key>.toml   (~/.cache/slide/machines/ by default)

by one atomic rename, and plans with it; later runs on a host with the same key (GPU model and
memory, CPU model, usable cores, RAM) read it back. A run's re-fit (`slide_ir.planning.refit`)
is kept beside it in `<Host.key>.refits.json`, under the run's shape (model, micro-batch, seq:
`refit_key`), and applied only to later runs of that shape: a re-fit measures how far the
profile is off at one shape, and applied to all of them, a small model's run (host-issue bound,
its GEMMs small) cut the GPU rates every later large run was planned with by 1.6x. `slide calibrate` writes the same entry with its
longer probes, so a calibration refreshes what `auto` uses. Every GPU is measured: none takes
another card's catalog figures. A cache file that cannot be read or parsed is measured again,
with one warning; one that cannot be written is only warned about.

In CPU mode (`--device cpu`) nothing is measured or cached: the "GPU" tier is host memory and
the cost figures are the `paper-pc-4090` preset's, as before (the simulator's GPU model does not
describe CPU compute, so a host-only probe would not make those predictions meaningful).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from slide.calibration import host_probes
from slide.calibration.host_probes import Host
from slide.errors import UserError
from slide.fileio import write_atomic
from slide_ir.planning.refit import refit_machine
from slide_ir.specs.hardware import (
    Machine,
    load_machine,
    load_machine_toml,
    machine_to_toml,
    with_drives,
    with_ram,
)
from slide_ir.specs.hardware_parts import Nvme, freeze_sources

log = logging.getLogger(__name__)
CPU_MODE_PRESET = "paper-pc-4090"


def auto_machine(device: Any, *, ram_gb: float | None = None, shape: str | None = None) -> Machine:
    """This host's machine for planning on `device` (a torch.device), re-fit to earlier runs
    of `shape` (`refit_key`) if any; `ram_gb` overrides the usable DRAM as `--ram-gb` does."""
    if device.type != "cuda":
        machine = _cpu_mode()
    else:
        host = host_probes.this_host(device)
        machine = cached(host) or measure(host)
        factors = _refits(host).get(shape or "")
        if factors:
            machine = refit_machine(machine, factors)
        machine = replace(machine, name=f"auto ({host.gpu})")
    return machine if ram_gb is None else with_ram(machine, ram_gb)


def resolve(
    name: str, device: Any, *, ram_gb: float | None = None, nvme: int | None = None,
    shape: str | None = None, nvme_dirs: Sequence[str] = (),
) -> Machine:  # fmt: skip
    """`auto`: this host on `device` (`auto_machine`, re-fit for `shape`), on CUDA with each of
    `nvme_dirs`' drives measured (`measured_drive`); else a catalog name or a .toml profile.
    `ram_gb` and `nvme` (a drive count) override either."""
    if name != "auto":
        return load_machine(name, ram_gb=ram_gb, nvme=nvme)
    machine = auto_machine(device, ram_gb=ram_gb, shape=shape)
    if nvme_dirs and device.type == "cuda":
        return with_measured_drives(machine, [Path(d) for d in nvme_dirs])
    return machine if nvme is None else with_drives(machine, nvme, None)


def with_measured_drives(machine: Machine, dirs: Sequence[Path]) -> Machine:
    """`machine` with one drive per directory, as measured there: a catalog drive's datasheet
    is not the user's drive (the H200 machine's virtual disk read 1.8 GB/s and wrote 2.9 under
    the steps where the default PCIe 4.0 drive says 7.0 and 6.9; the plan predicted 3,640
    tokens/s for a run that made 1,122)."""
    drives = tuple(measured_drive(d) for d in dirs)
    sources = {k: v for k, v in machine.sources if not k.startswith("nvme[")}
    for i, (_, source) in enumerate(drives):
        sources |= {f"nvme[{i}].{k}": source for k in DRIVE_FIGURES}
    return replace(machine, nvme=tuple(d for d, _ in drives), sources=freeze_sources(sources))


DRIVE_FIGURES = ("read_gb_per_s", "write_gb_per_s", "read_grid", "write_grid")


def drive_cache_path(directory: Path) -> Path:
    """A drive's cache entry, by this host and the filesystem `directory` is on."""
    return (
        cache_dir() / "drives" / f"{platform.node() or 'host'}-{os.stat(directory).st_dev:x}.json"
    )


def measured_drive(directory: Path) -> tuple[Nvme, str]:
    """The drive holding `directory`, its rates measured there once (`nvme_rates`: a 4 GiB
    file written, read and removed, ~10 s at 2 GB/s) and cached by its filesystem; its free
    space read each time. Returns the drive and the figures' source."""
    from slide.calibration import host_rate_probes as host_rates

    path = drive_cache_path(directory)
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
        rates = {k: float(got[k]) for k in ("read", "write")}
        grids, source = {k: str(got[k]) for k in ("read_grid", "write_grid")}, str(got["source"])
    except (OSError, ValueError, KeyError, TypeError):
        log.info("--machine auto: measuring the drive under %s (~10 s), cached for next time",
                 directory)  # fmt: skip
        probed = host_rates.nvme_rates(directory)
        rates = {k: probed[k].value for k in ("read", "write")}
        grids = {k: probed[k].text for k in ("read_grid", "write_grid")}
        source = (f"measured: {directory}, {datetime.date.today().isoformat()}, "
                  f"slide train --machine auto ({probed['read'].note})")  # fmt: skip
        try:
            write_atomic(path, json.dumps({**rates, **grids, "source": source}, indent=1) + "\n")
        except OSError as error:
            log.warning("--machine auto: cannot cache the drive's rates at %s (%s)", path, error)
    st = os.statvfs(directory)  # its free space is what a run can use
    drive = Nvme(name="measured-drive", capacity_bytes=st.f_bavail * st.f_frsize, gds=False,
                 read_bytes_per_s=rates["read"], write_bytes_per_s=rates["write"], **grids)  # fmt: skip
    return drive, source


def refit_key(model: str, micro_batch: int, seq: int) -> str:
    """The shape a re-fit belongs to: the model and one GPU's micro-batch of tokens."""
    return f"{model} {micro_batch}x{seq}"


def _cpu_mode() -> Machine:
    base = load_machine(CPU_MODE_PRESET)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return replace(base, name="auto (cpu)", gpu=replace(base.gpu, memory_bytes=ram), ram_bytes=ram)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slide" / "machines"


def cache_path(host: Host) -> Path:
    return cache_dir() / f"{host.key}.toml"


def cached(host: Host) -> Machine | None:
    """The cached profile of `host`, or None when there is none or it cannot be used (warned)."""
    path = cache_path(host)
    if not path.exists():
        return None
    try:
        machine = load_machine_toml(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: bad UTF-8, TOML or figures
        log.warning("--machine auto: cached profile %s is unusable (%s); measuring again",
                    path, error)  # fmt: skip
        return None
    log.info("--machine auto: this host's profile from %s", path)
    return machine


def measure(host: Host) -> Machine:
    """Run the `AUTO` probes on this host, cache the profile, and return it."""
    import torch

    log.info("--machine auto: measuring this host (%s, %s, %d cores; ~20 s), cached for next time",
             host.gpu, host.cpu, host.cores)  # fmt: skip
    stamp = f"measured: {host.gpu}, {datetime.date.today().isoformat()}, slide train --machine auto"
    try:
        table = host_probes.probe_table(host_probes.AUTO, host)
        got = host_probes.run_probes(table, budget_s=host_probes.AUTO_BUDGET_S)
    except torch.cuda.OutOfMemoryError as error:
        raise UserError(
            f"--machine auto: measuring this GPU ran out of memory ({error}); free the GPU or "
            "pass a profile (--machine <preset or .toml>)"
        ) from error
    finally:
        torch.cuda.empty_cache()  # the probes' blocks back to the driver before the run reserves
    machine = host_probes.profile(platform.node() or "auto", host, got, stamp)
    if store(host, machine, host_probes.header("slide train --machine auto", got)):
        _write_refits(host, {})  # re-fits of the profile measured before no longer apply
    return machine


def refits_path(host: Host) -> Path:
    return cache_dir() / f"{host.key}.refits.json"


def _refits(host: Host) -> dict[str, dict[str, float]]:
    """The re-fit factors of this host's runs by shape; none when unreadable (warned)."""
    path = refits_path(host)
    if not path.exists():
        return {}
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
        return {str(k): {str(f): float(x) for f, x in v.items()} for k, v in got.items()}
    except (OSError, ValueError, AttributeError) as error:
        log.warning("--machine auto: re-fits %s are unusable (%s); planning without them",
                    path, error)  # fmt: skip
        return {}


def _write_refits(host: Host, refits: Mapping[str, Mapping[str, float]]) -> Path | None:
    path = refits_path(host)
    try:
        write_atomic(path, json.dumps(refits, indent=1, sort_keys=True) + "\n")
    except OSError as error:
        log.warning("--machine auto: cannot write re-fits at %s (%s)", path, error)
        return None
    return path


def refit_cache(device: Any, factors: Mapping[str, float], shape: str) -> Path | None:
    """Keep a run's re-fit factors (`slide_ir.planning.refit`: measured / predicted per lane,
    or per dispatch floor) for this host's later runs of `shape`, which plan with them from
    their first step; the measured profile itself stays as the probes left it."""
    host = host_probes.this_host(device)
    if cached(host) is None or not factors:
        return None
    return _write_refits(host, _refits(host) | {shape: dict(factors)})


def store(host: Host, machine: Machine, header: str = "") -> Path | None:
    """Write `machine` as `host`'s cache entry (drives left out: a run names its own with `--nvme`
    and `--nvme-dir`); None, with a warning, when it cannot be written."""
    path = cache_path(host)
    kept = tuple((k, v) for k, v in machine.sources if not k.startswith("nvme["))
    text = machine_to_toml(replace(machine, nvme=(), sources=kept))
    described = f"# host: {host.gpu}; {host.cpu}; {host.cores} cores; {host.ram_bytes} B RAM\n"
    try:
        write_atomic(path, header + described + text)
    except OSError as error:
        log.warning("--machine auto: cannot cache this host's profile at %s (%s); it will be "
                    "measured again next run", path, error)  # fmt: skip
        return None
    return path
