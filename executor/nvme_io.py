"""Drive files without the page cache: O_DIRECT I/O, its alignment, and the buffered fallback.

Direct I/O moves bytes between the drive and our buffers with no copy in the page cache, so the
host-RAM ledger is what the process really holds. Linux asks that the file offset, the length
and the buffer address of each transfer be multiples of the logical block size; we use
ALIGN = 4096 (the page size, a multiple of every block size in use). The store (`nvme`) keeps
every region's start aligned and pads regions in the file; buffers that move through here are
allocated aligned (`aligned_empty`). A region's length need not be aligned: its last partial
block goes through a one-block bounce buffer, zero-padded (the padding is ours, in the layout).

Short transfers are taken as they come: the loop continues from where the call stopped; a stop
inside a block resumes through the bounce buffer, which re-reads or re-writes that whole block
(idempotent), so every call stays aligned.

Where the file system refuses O_DIRECT (EINVAL on open: tmpfs before Linux 6.6, some overlays),
`open_drive` says so once per directory (a logging warning) and falls back to buffered I/O that
drops the pages it touched after every transfer (fdatasync, then posix_fadvise DONTNEED).

Invariant: a file is created here only if it did not exist (O_EXCL), after its owner marker
(`leftovers.claim`: a killed run's file is removed by the next), so `remove_created` deletes
nothing that Slide did not write.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch

from executor import leftovers

log = logging.getLogger("executor.nvme")

ALIGN = 4096
O_DIRECT = getattr(os, "O_DIRECT", 0)
# Stop retrying one block that keeps coming back short (a device fault, not a slow disk).
BLOCK_RETRIES = 16
_ZEROS = memoryview(bytes(ALIGN))


class NvmeSpaceError(ValueError):
    """The NVMe directories cannot hold the run's files. A ValueError, like our other errors
    about what the user chose, so the command line prints it as one line."""


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose first byte is ALIGN-aligned: O_DIRECT can DMA into it.
    Costs at most ALIGN bytes more than `torch.empty` (torch aligns to 64 bytes only)."""
    nbytes = numel * dtype.itemsize
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
    skip = -raw.data_ptr() % ALIGN
    return raw[skip : skip + nbytes].view(dtype)


def as_bytes(t: torch.Tensor) -> memoryview:
    """A flat, writable byte view of a contiguous CPU tensor."""
    assert t.is_contiguous(), "NVMe transfers need contiguous buffers"
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


# -- the file's bytes ---------------------------------------------------------------------------
class DirectFile:
    """A drive file opened with O_DIRECT. One lane thread uses it at a time (plus the main
    thread before and after the lanes run); the bounce block is guarded anyway."""

    direct = True

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path
        self.bounce = aligned_empty(ALIGN, torch.uint8)
        self.lock = threading.Lock()
        self.warned = False

    def close(self) -> None:
        os.close(self.fd)

    def write(self, offset: int, t: torch.Tensor) -> None:
        self._transfer(offset, t, write=True)

    def read(self, offset: int, t: torch.Tensor) -> None:
        self._transfer(offset, t, write=False)

    def _transfer(self, offset: int, t: torch.Tensor, *, write: bool) -> None:
        assert offset % ALIGN == 0, f"{self.path}: region offset {offset} is not aligned"
        data = as_bytes(t)
        n, done = len(data), 0
        direct = t.data_ptr() % ALIGN == 0
        if not direct and not self.warned:
            self.warned = True
            log.warning("nvme: a %d-byte buffer at 0x%x is not %d-aligned: it goes through "
                        "%s one block at a time (slow)", n, t.data_ptr(), ALIGN, self.path)  # fmt: skip
        while done < n:
            rest = n - done
            if direct and done % ALIGN == 0 and rest >= ALIGN:
                body = data[done : done + rest - rest % ALIGN]
                done += self._call(write, body, offset + done)
            else:
                done = self._block(data, offset, done, write=write)

    def _call(self, write: bool, buf: memoryview, pos: int) -> int:
        got = os.pwrite(self.fd, buf, pos) if write else os.preadv(self.fd, [buf], pos)
        if got <= 0:
            what = "wrote nothing" if write else "read nothing (the file ends there)"
            raise OSError(errno.EIO, f"{self.path}: {what} at offset {pos}")
        return got

    def _block(self, data: memoryview, offset: int, done: int, *, write: bool) -> int:
        """The ALIGN-block of `data` that holds byte `done`, through the bounce buffer; returns
        where the transfer continues (the block's end, or the end of `data`)."""
        start = done - done % ALIGN
        take = min(ALIGN, len(data) - start)
        with self.lock:
            bounce = as_bytes(self.bounce)
            if write:
                bounce[:take] = data[start : start + take]
                bounce[take:] = _ZEROS[take:]  # padding inside the region: ours
            self._whole_block(write, bounce, offset + start)
            if not write:
                data[done : start + take] = bounce[done - start : take]
        return start + take

    def _whole_block(self, write: bool, bounce: memoryview, pos: int) -> None:
        for _ in range(BLOCK_RETRIES):
            if self._call(write, bounce, pos) == ALIGN:
                return
        raise OSError(errno.EIO, f"{self.path}: short transfers of the block at offset {pos}")


class BufferedFile:
    """The fallback where O_DIRECT is refused: plain pread/pwrite, then the touched pages are
    dropped (written back first: DONTNEED leaves dirty pages in the cache)."""

    direct = False

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past a region

    def close(self) -> None:
        os.close(self.fd)

    def write(self, offset: int, t: torch.Tensor) -> None:
        data = as_bytes(t)
        done = 0
        while done < len(data):
            got = os.pwrite(self.fd, data[done:], offset + done)
            if got <= 0:
                raise OSError(errno.EIO, f"{self.path}: wrote nothing at offset {offset + done}")
            done += got
        os.fdatasync(self.fd)
        self._drop(offset, len(data))

    def read(self, offset: int, t: torch.Tensor) -> None:
        data = as_bytes(t)
        done = 0
        while done < len(data):
            got = os.preadv(self.fd, [data[done:]], offset + done)
            if got <= 0:
                raise OSError(errno.EIO, f"{self.path}: short read at offset {offset + done}")
            done += got
        self._drop(offset, len(data))

    def _drop(self, offset: int, nbytes: int) -> None:
        """DONTNEED keeps partly covered pages: widen to whole blocks (the padding is ours)."""
        start = offset - offset % ALIGN
        os.posix_fadvise(self.fd, start, align_up(offset + nbytes) - start, os.POSIX_FADV_DONTNEED)


# -- creating and removing the files ------------------------------------------------------------
def check_space(needs: Mapping[Path, int]) -> None:
    """Refuse before anything is created: the bytes each file system must hold (files of the
    same file system added up) against what it has free for this user."""
    per_fs: dict[int, tuple[list[Path], int]] = {}
    for directory, nbytes in needs.items():
        fs = os.stat(directory).st_dev
        dirs, total = per_fs.get(fs, ([], 0))
        per_fs[fs] = ([*dirs, directory], total + nbytes)
    for dirs, need in per_fs.values():
        st = os.statvfs(dirs[0])
        free = st.f_bavail * st.f_frsize
        if need > free:
            raise NvmeSpaceError(_space_message(dirs, need, free))


def _space_message(dirs: Sequence[Path], need: int, free: int) -> str:
    where = ", ".join(map(str, dirs))
    return (
        f"--nvme-dir {where}: the NVMe files need {need} bytes ({need / 1e9:.2f} GB) but the "
        f"file system has {free} bytes ({free / 1e9:.2f} GB) free; free space there or give "
        f"another directory (one --nvme-dir per drive)"
    )


def create(path: Path, extents: Iterable[tuple[int, int]]) -> None:
    """Create `path` (it must not exist, unless a killed run of Slide's left it), sized to the
    layout, its used extents reserved where the file system can (fallocate: a disk that fills
    up later cannot fail a write)."""
    leftovers.claim(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        leftovers.marker(path).unlink()  # ours, just made
        raise FileExistsError(
            f"{path} exists and Slide did not write it (no {leftovers.marker(path).name} "
            "beside it): Slide never overwrites a file it did not create; delete it or give "
            "another --nvme-dir"
        ) from None
    try:
        spans = sorted(extents)
        os.ftruncate(fd, max((o + n for o, n in spans), default=0))
        for offset, nbytes in spans:
            _reserve(fd, path, offset, nbytes)
    except BaseException:
        leftovers.release(path)  # created just now: ours
        raise
    finally:
        os.close(fd)


def _reserve(fd: int, path: Path, offset: int, nbytes: int) -> None:
    if not nbytes or _fallocate is None:
        return
    if _fallocate(fd, 0, offset, nbytes) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.ENOSPC:
        raise NvmeSpaceError(
            f"--nvme-dir {path.parent}: no space left to reserve {nbytes} bytes of {path.name} "
            f"at offset {offset}; free space there or give another directory"
        )
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS):
        raise OSError(err, f"{path}: fallocate: {os.strerror(err)}")


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    """fallocate(2), not posix_fallocate: glibc's posix_fallocate emulates by writing, through
    the page cache, where the file system cannot reserve."""
    name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(name, use_errno=True), "fallocate", None) if name else None
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int
    return fn


_fallocate = _libc_fallocate()


def open_drive(path: Path, refused: dict[Path, str]) -> DirectFile | BufferedFile:
    """The created file, opened for direct I/O if its file system allows it. `refused`
    collects directory -> reason of each refusal, so a store warns once per directory."""
    fd = os.open(path, os.O_RDWR)
    if not O_DIRECT:
        return _fallback(fd, path, "this platform has no O_DIRECT", refused)
    try:
        direct = os.open(path, os.O_RDWR | O_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            os.close(fd)
            raise
        return _fallback(fd, path, f"O_DIRECT refused: {exc.strerror}", refused)
    os.close(fd)
    return DirectFile(direct, path)


def _fallback(fd: int, path: Path, reason: str, refused: dict[Path, str]) -> BufferedFile:
    if path.parent not in refused:
        refused[path.parent] = reason
        log.warning("nvme: %s (%s): buffered I/O, each transfer's pages dropped from the page "
                    "cache after it (on tmpfs the files are RAM all the same)",
                    path.parent, reason)  # fmt: skip
    return BufferedFile(fd, path)


def remove_created(paths: Iterable[Path]) -> None:
    for path in paths:
        leftovers.release(path)
