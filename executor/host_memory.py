"""Host allocations for a run: pageable, O_DIRECT-aligned, or pinned by registering an ordinary
allocation with CUDA at its exact size (`HostMemory`), registrations after the first on threads.

`executor.buffers` allocates every host pool through one `HostMemory`; the calibration's host
probes allocate theirs the same way, so they time the memory the executor uses.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from executor.nvme_io import aligned_empty

log = logging.getLogger("executor.host_memory")

REGISTER_THREADS = 8


def _register(t: torch.Tensor) -> int:
    """cudaHostRegister of `t`'s bytes; the CUDA error code (0: registered)."""
    return int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0))


def host_empty(numel: int, dtype: torch.dtype, aligned: bool) -> torch.Tensor:
    """A pageable host tensor; `aligned`: its first byte on a 4096-byte boundary (O_DIRECT)."""
    return aligned_empty(numel, dtype) if aligned else torch.empty(numel, dtype=dtype)


class HostMemory:
    """Host allocations. Pinned ones are ordinary allocations registered with CUDA
    (cudaHostRegister) at their exact size: torch's pinned allocator rounds every block up to a
    power of two, which could take up to twice the pinned memory the ledger plans. Registering
    faults in and locks every page, which one thread does at a fraction of the memory's speed:
    once the first registration has worked, the rest run on `REGISTER_THREADS` threads, and
    `wait()` (called at the end of `allocate`) joins them."""

    def __init__(self, pin: bool) -> None:
        self.pin, self.register = pin, True
        self.registered: list[torch.Tensor] = []
        self._threads: ThreadPoolExecutor | None = None
        self._pending: list[Future[int]] = []

    def empty(self, numel: int, dtype: torch.dtype, aligned: bool = False) -> torch.Tensor:
        """`aligned`: the first byte on a 4096-byte boundary, for O_DIRECT (see `nvme_io`)."""
        if not (self.pin and numel):
            return host_empty(numel, dtype, aligned)
        if self.register:
            t = host_empty(numel, dtype, aligned)
            if self._threads is not None:  # registration works here: the rest in parallel
                self._pending.append(self._threads.submit(_register, t))
                self.registered.append(t)
                return t
            err = _register(t)
            if not err:
                self.registered.append(t)
                self._threads = ThreadPoolExecutor(REGISTER_THREADS, thread_name_prefix="pin")
                return t
            self.register = False  # e.g. a sandboxed driver without host registration
            log.warning("cudaHostRegister failed (error %d): pinned pools use torch's pinned "
                        "allocator, which rounds each up to a power of two", err)  # fmt: skip
        return torch.empty(numel, dtype=dtype, pin_memory=True)

    def wait(self) -> None:
        """Join the registrations in flight; raise if one failed after the first worked."""
        if self._threads is None:
            return
        errors = [f.result() for f in self._pending]
        self._threads.shutdown()
        self._threads, self._pending = None, []
        failed = [e for e in errors if e]
        if failed:
            raise RuntimeError(
                f"cudaHostRegister failed (error {failed[0]}) for {len(failed)} of "
                f"{len(errors) + 1} pinned buffers, after the first was registered"
            )

    def close(self) -> None:
        """Unregister everything (the tensors must not be used for copies afterwards)."""
        with contextlib.suppress(RuntimeError):
            self.wait()
        for t in self.registered:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        self.registered.clear()
