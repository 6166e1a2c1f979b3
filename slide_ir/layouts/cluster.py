"""Cluster nodes for layout planning: GPUs per node, the NVLink domain, the network, the host.

Profiles live in `catalog/clusters/<name>.toml`, one node type each, every figure `k` with a
`k_source`. The GPU and CPU are parts of the hardware catalog (`gpus.toml`, `cpus.toml`) named
by `gpu` / `cpu`; the node adds what one GPU's machine profile does not know:

    gpus_per_node      GPUs sharing one NVLink domain and one host
    nvlink_gb_per_s    per GPU, each direction, as NCCL reaches it (bus bandwidth)
    network_gb_per_s   per GPU, each direction, between nodes (one NIC per GPU)
    host_ram_gib       host DRAM of the node (GiB), shared by its GPUs
    cpu_sockets        CPU sockets of the node (the part's rates are per socket)

`attention_ref_seq` (not in the TOML) is the sequence length the GPU's attention rate stands for:
16K, the long-sequence plateau, for the catalog's rule; a measured rate carries the length its
probe used (see `slide_ir.layouts.cost.attention_efficiency`).

Invariants: every figure is positive and sourced; `machine` is the single-GPU view (the node's
GPU, its PCIe link, one socket) so the single-GPU `CostModel` prices compute and host copies.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slide_ir.specs.hardware import Machine, load_machine_toml
from slide_ir.specs.hardware_parts import GIB

_DIR = Path(__file__).parents[1] / "catalog" / "clusters"
_NUMBERS = {
    "gpus_per_node": (int, 1),
    "cpu_sockets": (int, 1),
    "host_ram_gib": (float, GIB),
    "nvlink_gb_per_s": (float, 1e9),
    "network_gb_per_s": (float, 1e9),
}
_TEXT = ("gpu", "cpu", "intra_node")


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """One node type; a cluster is `nodes` of them (derived from the GPU count asked for)."""

    name: str
    machine: Machine
    gpus_per_node: int
    cpu_sockets: int
    host_ram_bytes: int
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    intra_node: str
    sources: tuple[tuple[str, str], ...]
    attention_ref_seq: int = 16384

    @property
    def gpu_memory_bytes(self) -> int:
        return int(self.machine.gpu.memory_bytes)

    def host_adam_elems_per_s(self) -> float:
        """FP32 AdamW elements/s of the whole host (every socket, DRAM-bound)."""
        return self.cpu_sockets * float(self.machine.cpu.adam_elems_per_s())


def cluster_names() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.toml"))


def load_cluster(name_or_path: str) -> Cluster:
    """A catalog node name or a node TOML file; ValueError naming the bad field otherwise."""
    path = Path(name_or_path)
    if not path.is_file():
        if name_or_path not in cluster_names():
            close = difflib.get_close_matches(name_or_path, cluster_names(), n=2)
            hint = f"; did you mean {', '.join(close)}?" if close else "."
            raise ValueError(
                f"unknown cluster node {name_or_path!r}{hint} Known: {', '.join(cluster_names())}"
            )
        path = _DIR / f"{name_or_path}.toml"
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from e
    return _cluster(doc, str(path))


def _sourced(doc: dict[str, Any], key: str, where: str) -> tuple[Any, str]:
    if key not in doc:
        raise ValueError(f"{where} {key}: missing")
    source = doc.get(f"{key}_source")
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{where} {key}: needs a non-empty {key}_source")
    return doc[key], source


def _cluster(doc: dict[str, Any], where: str) -> Cluster:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, (kind, scale) in _NUMBERS.items():
        raw, sources[key] = _sourced(doc, key, where)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
            raise ValueError(f"{where} {key}: must be a number > 0, got {raw!r}")
        if kind is int and not isinstance(raw, int):
            raise ValueError(f"{where} {key}: must be a whole number, got {raw!r}")
        values[key] = kind(raw * scale) if kind is int else float(raw) * scale
    for key in _TEXT:
        values[key], sources[key] = _sourced(doc, key, where)
    machine = load_machine_toml(
        "\n".join(
            [
                f"name = {json.dumps(str(doc.get('name', Path(where).stem)))}",
                f"ram_gib = {values['host_ram_gib'] / GIB}",
                f"ram_gib_source = {json.dumps(sources['host_ram_gib'])}",
                f"gpu = {json.dumps(values['gpu'])}",
                f"cpu = {json.dumps(values['cpu'])}",
            ]
        )
    )
    return Cluster(
        name=str(doc.get("name", Path(where).stem)),
        machine=machine,
        gpus_per_node=values["gpus_per_node"],
        cpu_sockets=values["cpu_sockets"],
        host_ram_bytes=int(values["host_ram_gib"]),
        nvlink_bytes_per_s=values["nvlink_gb_per_s"],
        network_bytes_per_s=values["network_gb_per_s"],
        intra_node=str(values["intra_node"]),
        sources=tuple(sorted(sources.items())),
    )
