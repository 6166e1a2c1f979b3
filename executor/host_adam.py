"""The single-pass host AdamW (csrc/host_adam.cpp): build on first use, call, or say why not.

The kernel reads the gradient, master and moments and writes master, moments and the
compute-dtype copy in one pass per element (28 bytes with FP32 moments and BF16 gradient and
copy, 20 with BF16 moments), vectorised by the compiler for the ISA the build targets and
threaded with OpenMP over `torch.get_num_threads()` threads (so `torch.set_num_threads` governs
it). Its arithmetic is torch's fused CPU AdamW, so it equals the chunked torch path in
`adam.py` bit for bit, but for the last bit of v at the few elements torch's scalar tail
handles.

It is JIT-compiled with `torch.utils.cpp_extension.load` into torch's extension cache (ninja
needed; `TORCH_EXTENSIONS_DIR` moves the cache). The extension's name carries the ISA (AVX-512,
AVX2 or portable), torch's version and a digest of the source, so a cache shared by different
hosts never runs code built for another CPU, nor checkouts one built from another source. If the build fails, `kernel()` returns None, the failure is logged once
with its reason, and `adam.py` keeps the torch path.

Start-up: a library already built (newer than this file and the source) is loaded directly,
without cpp_extension's ninja check; `prebuild()` starts the build on a thread so it overlaps
a run's set-up (a fresh host compiles it once, ~10-20 s); a build lock older than
`STALE_LOCK_S` (its builder was killed: cpp_extension would wait for it forever) is removed.

`sumsq` (a clipping norm's sum of squares) runs in the same library, on the same threads.

Invariant: `adamw_` takes 1-D contiguous CPU tensors of one length; master FP32, m and v one
dtype (FP32 or BF16), gradient and out FP32, BF16 or FP16 (out may be None: no copy).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from executor.buffers import OptState

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "host_adam.cpp"
# -ffp-contract=off: no fma the source does not write (the arithmetic must stay torch's);
# -fno-math-errno: lets sqrt vectorise (no errno for the non-negative v).
BASE_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno")
ISA_FLAGS = {
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "portable": (),
}

Kernel = Callable[..., None]
STALE_LOCK_S = 600.0  # no build takes this long; an older lock's builder is gone
ready_s: float | None = None  # seconds the kernel took to become ready (load or build)


def isa() -> str:
    """The widest ISA this CPU runs, as torch's own CPU kernels pick it."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap.startswith("AVX512"):
        return "avx512"
    return "avx2" if cap == "AVX2" else "portable"


def _ninja_on_path() -> None:
    """cpp_extension runs `ninja` from PATH; a venv used without activation (`.venv/bin/python
    -m pytest`) has the pip-installed one only in its own bin directory."""
    if shutil.which("ninja") is None:
        bins = [str(Path(sys.executable).parent)]
        with contextlib.suppress(ImportError):
            import ninja

            bins.insert(0, ninja.BIN_DIR)
        os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])


def _extensions_dir() -> Path:
    """torch's extension cache, as cpp_extension's `_get_build_directory` finds it."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return Path(root)
    hip, cuda = torch.version.hip, torch.version.cuda
    accel = (
        f"rocm{hip.replace('.', '')}" if hip else f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    )
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path.home() / ".cache" / "torch_extensions" / f"{py}_{accel}"


def _load_built(name: str) -> bool:
    """Load `name`'s library if a build newer than the source and this module is there."""
    lib = _extensions_dir() / name / f"{name}.so"
    try:
        newest = max(SOURCE.stat().st_mtime, Path(__file__).stat().st_mtime)
        if lib.stat().st_mtime < newest:
            return False
    except OSError:
        return False
    torch.ops.load_library(str(lib))
    return True


def _clear_stale_lock(name: str) -> None:
    lock = _extensions_dir() / name / "lock"
    with contextlib.suppress(OSError):
        age = time.time() - lock.stat().st_mtime
        if age > STALE_LOCK_S:
            log.warning("removing %s, %.0f s old: its build was killed", lock, age)
            lock.unlink()


def _build(target: str) -> Kernel:
    global ready_s
    tag = torch.__version__.split("+")[0].replace(".", "_")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:10]
    name = f"slide_host_adam_{target}_t{tag}_{digest}"
    start = time.perf_counter()
    if _load_built(name):
        ready_s = time.perf_counter() - start
        log.info("host AdamW kernel %s loaded in %.2f s", name, ready_s)
        return torch.ops.slide_host_adam.adamw_
    from torch.utils import cpp_extension  # here, not at import: only the cpu lane needs it

    _ninja_on_path()
    _clear_stale_lock(name)
    # a first run otherwise sits silent through the build (its step 1 pays for what is left)
    log.warning(
        "building the host AdamW kernel for this CPU (%s), once per host and torch version: "
        "~10-20 s; cached in %s",
        target,
        _extensions_dir() / name,
    )
    flags = [*BASE_FLAGS, *ISA_FLAGS[target]]
    cpp_extension.load(
        name=name,
        sources=[str(SOURCE)],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=False,
    )
    ready_s = time.perf_counter() - start
    log.info("host AdamW kernel %s built in %.1f s", name, ready_s)
    return torch.ops.slide_host_adam.adamw_


_LOCK = threading.Lock()  # one build per process, whichever thread asks first


def kernel() -> Kernel | None:
    """The compiled `adamw_` op, built on first call; None (logged once) if it cannot be built."""
    with _LOCK:
        return _kernel()


def prebuild() -> None:
    """Start loading or building the kernel on a daemon thread; `kernel()` waits for it."""
    threading.Thread(target=kernel, name="host-adam-build", daemon=True).start()


@functools.cache
def _kernel() -> Kernel | None:
    target = isa()
    try:
        return _build(target)
    except Exception as e:  # any build failure means: keep the torch path
        log.warning(
            "host AdamW kernel (%s) not built, using torch's fused AdamW: %s", target, _reason(e)
        )
        log.debug("host AdamW kernel build failure in full", exc_info=e)
        return None


def _reason(e: Exception) -> str:
    """The exception's type and the first line of it that names the cause (a compiler's
    `error:` line, a missing program), else its first line: a build log is long."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
    causes = (ln for ln in lines if "error:" in ln.lower() or "not found" in ln.lower())
    first_error = next(causes, lines[0])
    return f"{type(e).__name__}: {first_error[:300]}"


def adamw_(
    grad: torch.Tensor,
    master: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None,
    *,
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    grad_scale: float = 1.0,
    saved: OptState | None = None,
) -> None:
    """One AdamW step over equal-length 1-D tensors, in place (needs `kernel()` not None);
    `out` None: no compute-dtype copy written; `saved`: gets master, m and v as they were."""
    op = kernel()
    assert op is not None, "host AdamW kernel unavailable; check kernel() first"
    keep = (None, None, None) if saved is None else (saved.master, saved.m, saved.v)
    op(grad, master, m, v, out, step, lr, betas[0], betas[1], eps, weight_decay, grad_scale,
       *keep)  # fmt: skip


def sumsq(t: torch.Tensor) -> float | None:
    """The sum of squares of a contiguous CPU tensor, accumulated in double over the kernel's
    threads (None when the kernel is unavailable)."""
    if kernel() is None:
        return None
    return float(torch.ops.slide_host_adam.sumsq(t))
