"""One-dimensional searches over integer counts, for the placement search and the speculated
count (`speculation`): the minimum of a unimodal step time (golden-section search) and the
largest count that still fits (bisection).

Both assume what their callers establish: the function is unimodal, the predicate true up to
some count and false after. The caller memoizes the function; each search evaluates it
O(log n) times.
"""

from __future__ import annotations

from collections.abc import Callable

GOLDEN = 0.382


def argmin_unimodal(f: Callable[[int], float], lo: int, hi: int) -> int:
    """Integer argmin of a unimodal `f` on [lo, hi] by golden-section search (`f` memoized by
    the caller); the smallest argument among equal values."""
    while hi - lo > 3:
        a = lo + round(GOLDEN * (hi - lo))
        b = max(hi - round(GOLDEN * (hi - lo)), a + 1)
        if f(a) <= f(b):
            hi = b
        else:
            lo = a
    return min(range(lo, hi + 1), key=lambda x: (f(x), x))


def last_true(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """Largest x in [lo, hi] with ok(x), for ok true up to some x and false after."""
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo
