"""`--gpu-memory-gb` as the GPU's own limit, not only the plan's.

The planner sizes a capped plan to the cap, but torch's caching allocator would take the whole
card: on an H200 standing in for a 24 GB GPU a run then used 2.7 GiB more than its ledger
(bench/RESULTS.md, "The lean tape") and still ran, where the card it stands in for would have
run out. Capping the allocator makes the stand-in honest: past the cap torch frees its cached
blocks and retries, then raises the out-of-memory error the session explains with the ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from slide_ir.planning.compute_terms import CUDA_CONTEXT_BYTES
from slide_ir.specs.hardware_parts import GIB


def allocator_fraction(cap_gib: float, total_bytes: int) -> float:
    """The share of the card torch's allocator may hold under a cap of `cap_gib` GiB: the cap
    less the CUDA context (which the ledger counts and torch's share does not), at most all."""
    allowed = max(cap_gib * GIB - CUDA_CONTEXT_BYTES, 0)
    return min(1.0, allowed / total_bytes)


@contextmanager
def capped(device: torch.device, cap_gib: float | None) -> Iterator[None]:
    """Within it, torch's allocator on `device` holds at most `cap_gib` (none: no cap); the
    whole card again after it."""
    if device.type != "cuda" or cap_gib is None:
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(allocator_fraction(cap_gib, total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
