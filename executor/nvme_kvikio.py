"""The kvikio backend of the drive files (`pip install -e '.[nvme]'`): same interface as
`nvme_io.DirectFile` (read/write of a whole region at an aligned offset, close).

It is used only on CUDA, so CI (no GPU) never runs it; the H200 runs of bench/device/h200_nvme.sh
do, with kvikio-cu13's wheels carried in .whl (bench/RESULTS.md, sessions 10-12: `--optimizer
nvme`, `nvme-moments` and `--activations nvme` within 10% of their predictions).

What it does: `kvikio.CuFile(path, "r+")` on the file `nvme_io.create` made, `pread`/`pwrite`
through kvikio's thread pool (KVIKIO_NTHREADS, default 1; tasks of KVIKIO_TASK_SIZE). Our
buffers are host memory (the staging ring, the pinned activation staging), and for host memory
kvikio always takes its POSIX path, never GPUDirect Storage; we turn on its opportunistic direct
I/O (`auto_direct_io_read`/`_write`, kvikio >= 25.08) so the aligned body of each transfer
bypasses the page cache, as ours does. A GDS path (activations disk <-> GPU with no host bounce)
would need the ops to name device buffers: not planned yet.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import torch

log = logging.getLogger("executor.nvme")


def available(cuda: bool) -> bool:
    """kvikio is used when the run is on CUDA and it imports."""
    if not cuda:
        return False
    try:
        import kvikio  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        log.info("nvme: kvikio not used (%s): plain O_DIRECT files", exc)
        return False
    return True


def _configure() -> None:
    import kvikio.defaults

    try:
        kvikio.defaults.set({"auto_direct_io_read": True, "auto_direct_io_write": True})
    except (KeyError, ValueError, AttributeError, TypeError) as exc:
        log.warning("nvme: this kvikio cannot turn on direct I/O for host buffers (%s): "
                    "transfers go through the page cache", exc)  # fmt: skip


class KvikioFile:
    direct = True

    def __init__(self, path: Path) -> None:
        import kvikio

        _configure()
        self.path = path
        self.file = kvikio.CuFile(path, "r+")

    def close(self) -> None:
        self.file.close()

    def write(self, offset: int, t: torch.Tensor) -> None:
        self._check(self.file.pwrite(_array(t), t.nbytes, offset).get(), t, offset, "wrote")

    def read(self, offset: int, t: torch.Tensor) -> None:
        self._check(self.file.pread(_array(t), t.nbytes, offset).get(), t, offset, "read")

    def _check(self, got: int, t: torch.Tensor, offset: int, verb: str) -> None:
        if got != t.nbytes:
            raise OSError(errno.EIO, f"{self.path}: {verb} {got} of {t.nbytes} B at {offset}")


def _array(t: torch.Tensor):  # type: ignore[no-untyped-def]
    """Host tensors as numpy arrays (kvikio reads the buffer protocol); device tensors as they
    are (kvikio reads __cuda_array_interface__)."""
    flat = t.detach().reshape(-1).view(torch.uint8)
    return flat if flat.is_cuda else flat.numpy()
