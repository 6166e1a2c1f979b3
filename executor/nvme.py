"""NVMe tier: one file per drive, read and written at planned offsets.

Drive k's file is `nvme{k}.bin` in directory k mod (number of directories): give one directory
per physical drive (`--nvme-dir` repeated) to spread the files, or one for all of them.

I/O is os.pread / os.pwrite on the tensors' bytes (they release the GIL), through the page
cache. kvikio (GPUDirect Storage) is not wired in yet: it is installed neither here nor on the
device machine, and an untested path would be worse than none. Layout of drive k's file:

    [ optimizer stripe k of every NVMe-homed unit | saved-activation slots ]

A unit's optimizer state is striped by element range: stripe k holds elements
[k E, (k+1) E) (E = ceil(numel / drives)) as [FP32 master (if on NVMe) | m | v], so the update
of one stripe needs only its own staging buffer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from executor.adam import Part
from executor.buffers import OptState, stripe_numel

log = logging.getLogger("executor.nvme")
NvmeDirs = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def drive_paths(directories: NvmeDirs, drives: int) -> list[Path]:
    """Drive k's file: `nvme{k}.bin` in directories[k % len(directories)]; one path: all there."""
    if isinstance(directories, str | os.PathLike):
        dirs = [Path(directories)]
    else:
        dirs = [Path(d) for d in directories]
    if not dirs:
        raise ValueError("nvme_dir: give at least one directory for the NVMe drive files")
    return [dirs[k % len(dirs)] / f"nvme{k}.bin" for k in range(drives)]


@dataclass(frozen=True, kw_only=True, slots=True)
class StripeFormat:
    """How a stripe's bytes are laid out (shared by staging buffers and files)."""

    drives: int
    master_on_nvme: bool
    moments_dtype: torch.dtype

    def stripe_bytes(self, numel: int) -> int:
        per = (4 if self.master_on_nvme else 0) + 2 * self.moments_dtype.itemsize
        return stripe_numel(numel, self.drives) * per

    def stripe_range(self, numel: int, k: int) -> tuple[int, int]:
        e = stripe_numel(numel, self.drives)
        return min(k * e, numel), min((k + 1) * e, numel)

    def part(self, buf: torch.Tensor, numel: int, k: int, master: torch.Tensor | None) -> Part:
        """Typed views of staging buffer `buf` (uint8) holding stripe k; `master` is the unit's
        FP32 master in RAM when only the moments live on NVMe."""
        e = stripe_numel(numel, self.drives)
        lo, hi = self.stripe_range(numel, k)
        n, offset = hi - lo, 0
        if self.master_on_nvme:
            stripe_master = buf[: 4 * e].view(torch.float32)[:n]
            offset = 4 * e
        else:
            assert master is not None
            stripe_master = master[lo:hi]
        mb = self.moments_dtype.itemsize * e
        m = buf[offset : offset + mb].view(self.moments_dtype)[:n]
        v = buf[offset + mb : offset + 2 * mb].view(self.moments_dtype)[:n]
        return Part(lo=lo, hi=hi, state=OptState(master=stripe_master, m=m, v=v))


def _as_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy())


class NvmeStore:
    """The drive files. Offsets are fixed at construction; reads and writes are whole regions."""

    def __init__(self, directories: NvmeDirs, drives: int, sizes: dict[int, int]) -> None:
        self.paths = drive_paths(directories, drives)
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.offset: dict[int, int] = {}  # unit -> offset of its stripes on every drive
        end = 0
        for unit, nbytes in sorted(sizes.items()):
            self.offset[unit], end = end, end + nbytes
        self.act_base = end
        self.fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o600) for p in self.paths]
        log.info("nvme: drive files %s", ", ".join(map(str, self.paths)))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def write(self, drive: int, offset: int, t: torch.Tensor) -> None:
        data = _as_bytes(t)
        done = 0
        while done < len(data):
            done += os.pwrite(self.fds[drive], data[done:], offset + done)

    def read(self, drive: int, offset: int, t: torch.Tensor) -> None:
        data = _as_bytes(t)
        done = 0
        while done < len(data):
            got = os.preadv(self.fds[drive], [data[done:]], offset + done)
            if got == 0:
                raise OSError(f"{self.paths[drive]}: short read at offset {offset + done}")
            done += got

    def act_offset(self, slot_index: int, slot_bytes: int) -> int:
        return self.act_base + slot_index * slot_bytes
