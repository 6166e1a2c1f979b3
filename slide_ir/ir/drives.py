"""The NVMe tier's files: drive k's path and what it holds. `slide plan` names them and the
executor creates them, both from these functions, so a plan says where its bytes will go.

Drive k's file is `nvme{k}.bin` in directory k mod (number of directories): one directory per
physical drive (`--nvme-dir` repeated) spreads the files; one directory takes them all. Each file
holds the k-th stripe of every NVMe-homed unit's optimizer state, then the held gradients of the
units whose `grad_drive` it is (global clipping with `held_grads="nvme"`), then the
saved-activation slots written on that drive's lane.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slide_ir.ir.graph import Graph, PoolRole

NvmeDirs = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def drive_paths(directories: NvmeDirs, drives: int, tag: str = "") -> list[Path]:
    """Drive k's file: `nvme{k}{tag}.bin` in directories[k % len(directories)]; one path: all
    there. `tag` tells ranks' files apart (`.rank1`)."""
    if isinstance(directories, str | os.PathLike):
        dirs = [Path(directories)]
    else:
        dirs = [Path(d) for d in directories]
    if not dirs:
        raise ValueError("nvme_dir: give at least one directory for the NVMe drive files")
    return [dirs[k % len(dirs)] / f"nvme{k}{tag}.bin" for k in range(drives)]


def act_slots_by_drive(graph: Graph, drives: int) -> dict[int, range]:
    """drive -> the NVMe activation slots its file holds: those of its own pool."""
    pools = {p.name: p for p in graph.pools}
    return {k: range(pools[act_pool(k)].slots) for k in range(drives) if act_pool(k) in pools}


def act_drive(layer: int, drives: int) -> int:
    """The drive a layer's saved input goes to: round-robin by layer (decoder layers count from
    1), whole tensors, no striping."""
    return layer % drives


def act_pool(drive: int) -> str:
    """The pool of a drive's activation slots: a slot per layer saved there, so a file holds
    only its own layers' inputs (one pool for all drives let every slot land on every drive)."""
    return f"nvme{drive}_acts"


def grad_drive(unit: int, drives: int) -> int:
    """The drive a unit's held gradient (global clipping, `held_grads="nvme"`) waits on:
    round-robin by unit, whole tensors."""
    return unit % drives


def grad_pool(drive: int) -> str:
    """The prefix of a drive's held-gradient pools (`nvme0_grads_layers`)."""
    return f"nvme{drive}_grads"


def saved_per_drive(saved_layers: int, drives: int) -> list[int]:
    """How many of layers 1..saved_layers (those not keeping their tape) each drive holds."""
    counts = [0] * drives
    for layer in range(1, saved_layers + 1):
        counts[act_drive(layer, drives)] += 1
    return counts


@dataclass(frozen=True, slots=True)
class DriveContents:
    """What one drive's file holds, before the executor's alignment padding."""

    state_bytes: int  # its stripe of every NVMe-homed unit's optimizer state
    act_bytes: int  # the saved layer inputs written on its lane
    grad_bytes: int = 0  # the held gradients of its units

    @property
    def bytes(self) -> int:
        return self.state_bytes + self.grad_bytes + self.act_bytes


def drive_contents(graph: Graph, drives: int) -> list[DriveContents]:
    """Each drive's share: the state striped evenly, its own held gradients and pool of
    activation slots."""
    pools = {p.name: p for p in graph.pools}
    state = sum(p.bytes for p in graph.pools if p.role == PoolRole.NVME_STATE)
    grads = [sum(p.bytes for p in graph.pools if p.role == PoolRole.NVME_GRADS
                 and p.name.startswith(f"{grad_pool(k)}_")) for k in range(drives)]  # fmt: skip
    return [
        DriveContents(
            -(-state // drives), pools[act_pool(k)].bytes if act_pool(k) in pools else 0, grads[k]
        )
        for k in range(drives)
    ]
