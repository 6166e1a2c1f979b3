"""Hardware catalog: machines loaded from plain TOML, every figure tagged with its source.

Figures live in TOML so people can edit and share them:

    catalog/hardware/{gpus,links,cpus,nvme}.toml   parts, one table per part
    catalog/machines/<name>.toml                   presets: parts by name, plus inline overrides

TOML keys carry human units (`memory_gib`, `hbm_gb_per_s`, `capacity_gb`) and every figure `k`
needs a `k_source` beside it (datasheet URL, paper, or `measured: <machine>, <date>`). A machine
section is a part name (`cpu = "epyc-7543"`), a table with `preset = "..."` plus overrides (each
with its own source), or a full inline definition, which is what `machine_to_toml` writes. The
dataclasses (`Gpu`, `Link`, `Cpu`, `Nvme`, `Machine`) live in `hardware_parts`; import them here.

Invariants: every figure is positive and sourced; TOML floats are read as `Decimal` and scaled
exactly, so loading what `machine_to_toml(m)` wrote gives back `m`, bit for bit.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal, localcontext
from functools import cache
from pathlib import Path
from typing import Any

from slide_ir.specs.hardware_parts import GIB, Cpu, Figure, Gpu, Link, Machine, Nvme, figures
from slide_ir.specs.hardware_parts import freeze_sources as _freeze

__all__ = [
    "Cpu", "Gpu", "HardwareConfigError", "Link", "Machine", "Nvme", "UnknownHardwareError",
    "cpu_names", "gpu_names", "load_machine", "load_machine_toml", "machine_names",
    "machine_to_toml", "nvme_names", "with_drives",
]  # fmt: skip

CATALOG = Path(__file__).parents[1] / "catalog"  # slide_ir/catalog
_PARTS_DIR = CATALOG / "hardware"
_MACHINES_DIR = CATALOG / "machines"
_DEFAULT_NVME = "samsung-990-pro-2tb"  # a PCIe 4.0 drive, used by `nvme=N` when none is named


class UnknownHardwareError(ValueError):
    """A machine or part name that is not in the catalog; the message lists close matches."""


class HardwareConfigError(ValueError):
    """A hardware TOML file that cannot be used; the message names the file and the field."""


_FILES: dict[type, str] = {
    Gpu: "gpus.toml",
    Link: "links.toml",
    Cpu: "cpus.toml",
    Nvme: "nvme.toml",
}
_MACHINE_KEYS = {"name", "notes", "gpu", "link", "cpu", "nvme"}


def _to_base(fig: Figure, raw: Any, where: str) -> Any:
    """TOML value -> dataclass value; Decimal arithmetic keeps the scaling exact."""
    if fig.kind in (str, bool):
        if not isinstance(raw, fig.kind) or raw == "":
            want = "a non-empty string" if fig.kind is str else "true or false"
            raise HardwareConfigError(f"{where} {fig.key}: must be {want}, got {raw!r}")
        return raw
    if isinstance(raw, bool) or not isinstance(raw, int | Decimal):
        raise HardwareConfigError(f"{where} {fig.key}: must be a number, got {raw!r}")
    if not Decimal(raw).is_finite() or raw <= 0:
        raise HardwareConfigError(f"{where} {fig.key}: must be > 0, got {raw}")
    with localcontext() as ctx:
        ctx.prec = 60
        base = Decimal(raw) * fig.scale
    if fig.kind is float:
        return float(base)
    if fig.scale == 1 and base != base.to_integral_value():
        raise HardwareConfigError(f"{where} {fig.key}: must be a whole number, got {raw}")
    return int(base.to_integral_value())


def _toml_str(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, except that TOML also escapes DEL."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _from_base(fig: Figure, value: Any) -> str:
    """Dataclass value -> TOML text that `_to_base` maps back to exactly `value`."""
    if fig.kind is str:
        return _toml_str(value)
    if fig.kind is bool:
        return "true" if value else "false"
    if fig.scale == GIB:
        number = Decimal(repr(value / GIB))  # dividing by a power of two is exact
    else:
        exact = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
        number = exact.scaleb(-round(math.log10(fig.scale)))
    text = format(number.normalize(), "f")
    return text if "." in text or fig.kind is int else text + ".0"


def _figure(table: Mapping[str, Any], fig: Figure, where: str) -> tuple[Any, str]:
    """One sourced figure of a table: (value in base units, source)."""
    if fig.key not in table:
        raise HardwareConfigError(f"{where} {fig.key}: missing figure")
    source = table.get(f"{fig.key}_source")
    if not isinstance(source, str) or not source.strip():
        raise HardwareConfigError(
            f"{where} {fig.key}: needs a non-empty {fig.key}_source "
            "(datasheet URL, paper, or 'measured: <machine>, <date>')"
        )
    return _to_base(fig, table[fig.key], where), source


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise HardwareConfigError(f"{where} {key}: unknown key{hint}")


def _build(cls: type, table: Mapping[str, Any], where: str) -> tuple[Any, dict[str, str]]:
    """A complete table -> (part, {field: source}); errors name `where` and the key."""
    allowed = {k for f in figures(cls) for k in (f.key, f"{f.key}_source")} | {"name", "notes"}
    _check_keys(table, allowed | ({"link", "link_source"} if cls is Gpu else set()), where)
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise HardwareConfigError(f"{where} name: missing or empty")
    values: dict[str, Any] = {"name": name}
    sources: dict[str, str] = {}
    for fig in figures(cls):
        if fig.optional and fig.key not in table:
            continue
        values[fig.field], sources[fig.field] = _figure(table, fig, where)
    try:
        return cls(**values), sources
    except ValueError as error:
        raise HardwareConfigError(f"{where}: {error}") from error


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text, parse_float=Decimal)
    except tomllib.TOMLDecodeError as error:
        raise HardwareConfigError(f"{where}: not valid TOML: {error}") from error


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return _parse(path.read_text(encoding="utf-8"), str(path))
    except OSError as error:
        raise HardwareConfigError(f"{path}: cannot read: {error}") from error


@cache
def _parts(cls: type) -> dict[str, Any]:
    """The catalog file of one kind, parsed once; callers copy tables before changing them."""
    return _read_toml(_PARTS_DIR / _FILES[cls])


def _unknown(what: str, name: str, known: list[str]) -> UnknownHardwareError:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "."
    return UnknownHardwareError(
        f"unknown {what} {name!r}{hint} Known: {', '.join(known)}. "
        "`slide machines` lists the machines and their parts."
    )


def _part(cls: type, name: str) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """A catalog part by name: (part, sources, its table), validated against its own file."""
    tables = _parts(cls)
    if not isinstance(tables.get(name), dict):
        raise _unknown(cls.__name__.lower(), name, _names(cls))
    table = {"name": name, **tables[name]}
    return (*_build(cls, table, f"{_PARTS_DIR / _FILES[cls]} [{name}]"), table)


def _section(cls: type, spec: Any, where: str) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """A machine's part: a catalog name, `preset = ...` plus overrides, or a full inline table."""
    if isinstance(spec, str):
        return _part(cls, spec)
    if not isinstance(spec, dict):
        raise HardwareConfigError(f"{where}: must be a part name or a table")
    preset = spec.get("preset")
    if preset is None:
        return (*_build(cls, spec, where), spec)
    if not isinstance(preset, str):
        raise HardwareConfigError(f"{where} preset: must be a part name")
    overrides = {k: v for k, v in spec.items() if k != "preset"}
    for fig in figures(cls):  # a new figure under the preset's old source would be misattributed
        if fig.key in overrides and f"{fig.key}_source" not in overrides:
            raise HardwareConfigError(f"{where} {fig.key}: override needs its own {fig.key}_source")
    table = {**_part(cls, preset)[2], **overrides}
    return (*_build(cls, table, where), table)


def _drives(doc: Mapping[str, Any], where: str) -> list[Any]:
    """`nvme = ["a", "a"]`, or tables, where `count = N` stands for N copies of one drive."""
    spec = doc.get("nvme", [])
    if not isinstance(spec, list):
        raise HardwareConfigError(f"{where} nvme: must be a list of drive names or tables")
    drives: list[Any] = []
    for item in spec:
        count = item.get("count", 1) if isinstance(item, dict) else 1
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise HardwareConfigError(f"{where} nvme count: must be a whole number >= 1")
        if isinstance(item, dict):
            item = {k: v for k, v in item.items() if k != "count"}
        drives += [item] * count
    return drives


def _machine(doc: dict[str, Any], where: str, default_name: str) -> Machine:
    own = figures(Machine)  # ram_bytes, price_usd
    _check_keys(doc, _MACHINE_KEYS | {k for f in own for k in (f.key, f"{f.key}_source")}, where)
    for key in ("gpu", "cpu"):
        if key not in doc:
            raise HardwareConfigError(f"{where} {key}: missing")
    gpu, gpu_src, gpu_table = _section(Gpu, doc["gpu"], f"{where} [gpu]")
    link_spec = doc.get("link", gpu_table.get("link"))
    if link_spec is None:
        raise HardwareConfigError(f"{where} link: missing, and gpu {gpu.name!r} names none")
    link, link_src, _ = _section(Link, link_spec, f"{where} [link]")
    cpu, cpu_src, _ = _section(Cpu, doc["cpu"], f"{where} [cpu]")
    drives = [
        _section(Nvme, d, f"{where} [nvme {i}]")[:2] for i, d in enumerate(_drives(doc, where))
    ]
    named = [("gpu", gpu_src), ("link", link_src), ("cpu", cpu_src)]
    named += [(f"nvme[{i}]", drive_src) for i, (_, drive_src) in enumerate(drives)]
    sources = {f"{prefix}.{k}": v for prefix, src in named for k, v in src.items()}
    values = {"name": doc.get("name", default_name), "gpu": gpu, "link": link, "cpu": cpu,
              "nvme": tuple(d for d, _ in drives)}  # fmt: skip
    for fig in own:
        if fig.key in doc or fig.field == "ram_bytes":  # the price is optional
            values[fig.field], sources[fig.field] = _figure(doc, fig, where)
    try:
        return Machine(**values, sources=_freeze(sources))
    except ValueError as error:
        raise HardwareConfigError(f"{where}: {error}") from error


def _names(cls: type) -> list[str]:
    return sorted(name for name, table in _parts(cls).items() if isinstance(table, dict))


def machine_names() -> list[str]:
    """Machine presets in the catalog (catalog/machines/*.toml)."""
    return sorted(p.stem for p in _MACHINES_DIR.glob("*.toml"))


def gpu_names() -> list[str]:
    return _names(Gpu)


def cpu_names() -> list[str]:
    return _names(Cpu)


def nvme_names() -> list[str]:
    return _names(Nvme)


def load_gpu(name: str) -> tuple[Gpu, dict[str, str]]:
    """A catalog GPU and the sources of its figures (calibrate keeps the datasheet peak)."""
    part, sources, _ = _part(Gpu, name)
    return part, sources


def with_ram(machine: Machine, ram_gb: float) -> Machine:
    """The machine with `ram_gb` GiB of usable DRAM (the `--ram-gb` override)."""
    sources = _freeze(dict(machine.sources) | {"ram_bytes": f"override: ram_gb={ram_gb}"})
    return replace(machine, ram_bytes=ram_bytes(ram_gb), sources=sources)


def ram_bytes(ram_gb: float) -> int:
    """`ram_gb` GiB in bytes, refused (ValueError) unless a finite number > 0."""
    finite = (
        isinstance(ram_gb, int | float) and not isinstance(ram_gb, bool) and math.isfinite(ram_gb)
    )
    if not finite or not ram_gb > 0:
        raise ValueError(f"ram_gb must be a finite number of GiB > 0, got {ram_gb!r}")
    return round(ram_gb * GIB)


def with_drives(machine: Machine, count: int | None = None, model: str | None = None) -> Machine:
    """The machine with `count` drives (default: as many as it has, at least one), each of catalog
    drive `model`, or else the machine's own model, or else a PCIe 4.0 default."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"nvme drive count must be a whole number >= 0, got {count!r}")
    if model is None and machine.nvme:
        drive, first = machine.nvme[0], "nvme[0]."
        drive_src = {k.removeprefix(first): v for k, v in machine.sources if k.startswith(first)}
    else:
        drive, drive_src, _ = _part(Nvme, model or _DEFAULT_NVME)
    n = (len(machine.nvme) or 1) if count is None else count
    sources = {k: v for k, v in machine.sources if not k.startswith("nvme[")}
    sources |= {f"nvme[{i}].{k}": v for i in range(n) for k, v in drive_src.items()}
    return replace(machine, nvme=(drive,) * n, sources=_freeze(sources))


def load_machine(
    name_or_path: str,
    *,
    ram_gb: float | None = None,
    nvme: int | None = None,
    nvme_model: str | None = None,
) -> Machine:
    """A catalog machine by name, or a machine TOML by path, with optional overrides.

    ram_gb: usable DRAM in GB as DIMMs and `free -g` count them (1 GB = 2**30 bytes).
    nvme: number of drives, each the machine's own model, or `nvme_model`, or a PCIe 4.0 default;
    `nvme_model` alone swaps the model and keeps the count.
    """
    if name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path:
        path = Path(name_or_path)
    elif name_or_path in machine_names():
        path = _MACHINES_DIR / f"{name_or_path}.toml"
    else:
        raise _unknown("machine", name_or_path, machine_names())
    machine = _machine(_read_toml(path), str(path), path.stem)
    if ram_gb is not None:
        machine = with_ram(machine, ram_gb)
    if nvme is not None or nvme_model is not None:
        machine = with_drives(machine, nvme, nvme_model)
    return machine


def load_machine_toml(text: str) -> Machine:
    """A machine from TOML text, e.g. what `machine_to_toml` wrote into a saved plan."""
    return _machine(_parse(text, "<machine TOML>"), "<machine TOML>", "machine")


def _part_lines(
    part: Gpu | Link | Cpu | Nvme, sources: Mapping[str, str], prefix: str
) -> list[str]:
    lines = [f"name = {_toml_str(part.name)}"]
    for fig in figures(type(part)):
        if (value := getattr(part, fig.field)) is not None:
            lines += _figure_lines(fig, value, sources.get(f"{prefix}.{fig.field}"))
    return lines


def _figure_lines(fig: Figure, value: Any, source: str | None) -> list[str]:
    source_text = _toml_str(source or "not recorded")
    return [f"{fig.key} = {_from_base(fig, value)}", f"{fig.key}_source = {source_text}"]


def machine_to_toml(machine: Machine) -> str:
    """The machine as a self-contained TOML file (every figure inline with its source)."""
    sources = dict(machine.sources)
    lines = [
        "# Written by slide_ir.specs.hardware.machine_to_toml: every figure inline, with its source.",
        f"name = {_toml_str(machine.name)}",
    ]
    for fig in figures(Machine):
        if (value := getattr(machine, fig.field)) is not None:
            lines += _figure_lines(fig, value, sources.get(fig.field))
    for section in ("gpu", "link", "cpu"):
        lines += ["", f"[{section}]", *_part_lines(getattr(machine, section), sources, section)]
    for i, drive in enumerate(machine.nvme):
        lines += ["", "[[nvme]]", *_part_lines(drive, sources, f"nvme[{i}]")]
    return "\n".join(lines) + "\n"
