"""CPython's tuple free lists, filled when the steady state begins.

`torch.autograd.backward` makes the tuple of its inputs from a generator: CPython allocates ten
slots and shrinks the tuple to its length, so the tuple comes from fresh memory, and once freed it
goes onto the free list for its length, from which no later backward takes it. Each backward so
adds one tuple to a list until the list holds CPython's cap, 2,000 (lengths 1-19 in the default
build of CPython 3.11-3.13, one set of lists per interpreter). With one loss backward per step,
its 3-item list fills last: tiny-llama on CPU grew 340-372 kB in 4 kB pages over steps 200-3,000,
and 32-56 kB over steps 200-2,000 with the lists filled after step 1 (bench/RESULTS.md).

Filling them before step 1 does not last: the first step keeps thousands of tuples for good
(torch's and the lanes' one-time objects), and the set-up's objects call for a full collection,
which empties every list. None came later in 2,000 steps; if one does, the lists refill as before,
a bounded growth again.
"""

from __future__ import annotations

_LENGTHS = range(1, 20)
_CAP = 2000


def fill_tuple_free_lists() -> None:
    """Make and drop `_CAP` tuples of every length that has a free list (about 1 ms)."""
    items = list(_LENGTHS)
    held = [tuple(items[:n]) for n in _LENGTHS for _ in range(_CAP)]
    del held
