"""NVMe tier: one file per drive, read and written at planned offsets.

Drive k's file and what it holds: `slide_ir.ir.drives` (the plan names them from there).

I/O bypasses the page cache: O_DIRECT files (`nvme_io`: aligned regions and buffers, short
transfers resumed, a buffered fallback that drops its pages where O_DIRECT is refused), or
kvikio's CuFile (`nvme_kvikio`, on CUDA where it imports). Both release the GIL.
Layout of drive k's file (each region ALIGN-aligned, padded):

    [ optimizer stripe k of every NVMe-homed unit | held gradients of its units | saved-activation slots ]

A unit's optimizer state is striped by element range: stripe k holds elements
[k E, (k+1) E) (E = ceil(numel / drives)) as [FP32 master (if on NVMe) | m | v], so the update
of one stripe needs only its own staging buffer.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from executor import nvme_io, nvme_kvikio
from executor.adam import Part
from executor.buffers import OptState, stripe_numel
from executor.nvme_io import align_up
from slide_ir.ir.drives import NvmeDirs, drive_paths

log = logging.getLogger("executor.nvme")


class DriveFile(Protocol):
    """One drive's file: `nvme_io.DirectFile`, `nvme_io.BufferedFile`, `nvme_kvikio.KvikioFile`."""

    direct: bool

    def read(self, offset: int, t: torch.Tensor) -> None: ...
    def write(self, offset: int, t: torch.Tensor) -> None: ...
    def close(self) -> None: ...


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


class NvmeStore:
    """The drive files. Offsets are fixed at construction; reads and writes are whole regions.

    Layout of every drive's file, each region starting ALIGN-aligned (padded in the file):
    unit u's optimizer stripe at `offset[u]`, then the held gradient of each unit whose drive it
    is at `grad_offset[u]`, then activation slot j at `act_offset(j)`.
    Construction checks free space, creates the files (refusing to reuse existing ones) and
    reserves what they will hold; `close` removes them, and so does a failed construction.
    """

    def __init__(
        self,
        directories: NvmeDirs,
        drives: int,
        sizes: Mapping[int, int],
        *,
        act_slots: Mapping[int, Iterable[int]] | None = None,
        act_bytes: int = 0,
        grad_sizes: Mapping[int, tuple[int, int]] | None = None,
        backend: str = "direct",
        tag: str = "",
    ) -> None:
        self.paths = drive_paths(directories, drives, tag)
        self.offset: dict[int, int] = {}  # unit -> offset of its stripes on every drive
        end = 0
        for unit, nbytes in sorted(sizes.items()):
            self.offset[unit], end = end, end + align_up(nbytes)
        # unit -> offset of its held gradient on its own drive (`grad_sizes`: unit -> drive, bytes)
        self.grad_offset: dict[int, int] = {}
        grad_ends = [end] * drives
        for unit, (drive, nbytes) in sorted((grad_sizes or {}).items()):
            self.grad_offset[unit] = grad_ends[drive]
            grad_ends[drive] += align_up(nbytes)
        self.state_end = end
        self.grad_ends = grad_ends
        self.act_base, self.act_bytes, self.act_stride = (
            max(grad_ends, default=end),
            act_bytes,
            align_up(act_bytes),
        )
        self.extents = [self._extents(k, (act_slots or {}).get(k, ())) for k in range(drives)]
        self.files: list[DriveFile] = []
        self.created: list[Path] = []
        self.backend = backend
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        log.info("nvme: drive files %s (%s)", ", ".join(map(str, self.paths)), self.kind)

    @property
    def drives(self) -> int:
        return len(self.paths)

    def _extents(self, drive: int, slots: Iterable[int]) -> list[tuple[int, int]]:
        """(offset, bytes) of what drive `drive`'s file holds: all stripes, its held gradients,
        its act slots."""
        out = [(0, self.state_end)] if self.state_end else []
        if self.grad_ends[drive] > self.state_end:
            out.append((self.state_end, self.grad_ends[drive] - self.state_end))
        return out + [(self.act_offset(j, self.act_bytes), self.act_stride) for j in set(slots)]

    def _open(self) -> None:
        for path in self.paths:
            path.parent.mkdir(parents=True, exist_ok=True)
        needs: dict[Path, int] = {}
        for path, extents in zip(self.paths, self.extents, strict=True):
            needs[path.parent] = needs.get(path.parent, 0) + sum(n for _, n in extents)
        nvme_io.check_space(needs)
        refused: dict[Path, str] = {}
        for path, extents in zip(self.paths, self.extents, strict=True):
            nvme_io.create(path, extents)
            self.created.append(path)
            if self.backend == "kvikio":
                self.files.append(nvme_kvikio.KvikioFile(path))
            else:
                self.files.append(nvme_io.open_drive(path, refused))

    @property
    def kind(self) -> str:
        """How the files are read and written: kvikio, O_DIRECT or buffered."""
        if self.backend == "kvikio":
            return "kvikio"
        return "O_DIRECT" if self.direct else "buffered"

    @property
    def direct(self) -> bool:
        """Whether every file bypasses the page cache with O_DIRECT (or kvikio's direct I/O)."""
        return all(f.direct for f in self.files)

    def close(self) -> None:
        """Close and remove the files (their state was read back, or the run failed)."""
        for f in self.files:
            f.close()
        self.files = []
        nvme_io.remove_created(self.created)
        self.created = []

    def write(self, drive: int, offset: int, t: torch.Tensor) -> None:
        try:
            self.files[drive].write(offset, t)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise nvme_io.NvmeSpaceError(
                    f"--nvme-dir {self.paths[drive].parent}: no space left writing "
                    f"{t.nbytes} bytes at offset {offset} of {self.paths[drive].name}"
                ) from exc
            raise

    def read(self, drive: int, offset: int, t: torch.Tensor) -> None:
        self.files[drive].read(offset, t)

    def act_offset(self, slot_index: int, slot_bytes: int) -> int:
        assert slot_bytes == self.act_bytes, (slot_bytes, self.act_bytes)
        return self.act_base + slot_index * self.act_stride


def backend_for(cuda: bool) -> str:
    """kvikio where the run is on CUDA and kvikio imports; our O_DIRECT files elsewhere."""
    return "kvikio" if nvme_kvikio.available(cuda) else "direct"
