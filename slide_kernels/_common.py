"""What every kernel module shares: when to take the Triton path, launch sizes, one-time logs.

The Triton path runs for CUDA tensors, and for float32 CPU tensors when TRITON_INTERPRET=1 (the
interpreter has no bfloat16 arithmetic). Everything else takes the pure-torch reference in
`slide_kernels.reference`, and the first such call per op logs why.
"""

import functools
import logging
import os

import torch

log = logging.getLogger("slide_kernels")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - the GPU stack always has it
    HAS_TRITON = False


def use_triton(op: str, *tensors: torch.Tensor) -> bool:
    """True if `op` should run its Triton kernel on `tensors`; else logs (once per reason) why not."""
    if not HAS_TRITON:
        _log_fallback(op, "triton is not installed")
        return False
    if all(t.is_cuda for t in tensors):
        return True
    if INTERPRET and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return True
    _log_fallback(op, "tensors are not on CUDA (or float32 under TRITON_INTERPRET=1)")
    return False


@functools.cache
def _log_fallback(op: str, reason: str) -> None:
    log.info("slide_kernels.%s: using the pure-torch reference because %s", op, reason)


def num_programs_cap(device: torch.device, per_sm: int = 4) -> int:
    """Programs for a persistent grid: per_sm per SM on the GPU, a handful in the interpreter."""
    if device.type != "cuda":
        return 4
    return per_sm * torch.cuda.get_device_properties(device).multi_processor_count


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def num_warps_for(elements: int, per_thread: int = 16) -> int:
    """Warps for a tile of `elements`, `per_thread` elements per thread: 1 to 16 warps."""
    return max(1, min(16, elements // (32 * per_thread)))
