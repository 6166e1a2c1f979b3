"""Static checks of a graph's order and dataflow, run when a `Graph` is built.

`Order` answers "does op b wait for op a?" (a chain of dependency and lane-order edges joins
them) in O(1). Every edge points forward in the op list and each lane is a total order, so a
vector clock per op suffices: for every lane, the position of the last op of that lane the op
waits for; b waits for a iff a's position on its lane <= b's clock entry for that lane.

Dataflow (on the ops' `reads` / `writes`, a value being (name, slot)):
- every read waits for the latest earlier writer of its value; a value no earlier op writes
  must sit in a static pool (the initial state: weights, master, moments loaded before the run);
- two writers of one value are ordered (no write-write race); an accumulating write (`+=`) also
  reads the value, and is checked as a read too.
Slot reuse (one tenant at a time, the next acquirer waiting for the last release) is checked
by `check_tenancy`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slide_ir.ir.graph import Op


class Order:
    """Which ops each op waits for, transitively (see the module docstring)."""

    def __init__(self, ops: Sequence[Op]) -> None:
        lanes: dict[str, int] = {}
        for op in ops:
            lanes.setdefault(op.lane, len(lanes))
        self.where: dict[str, tuple[int, int]] = {}  # op id -> (lane, position on the lane)
        self.clock: dict[str, list[int]] = {}
        tail: dict[int, list[int]] = {}  # lane -> the clock of its last op so far
        count = [0] * len(lanes)
        for op in ops:
            lane = lanes[op.lane]
            prev = tail.get(lane)
            clock = list(prev) if prev else [-1] * len(lanes)
            for dep in op.deps:
                other = self.clock[dep]
                if clock != other:
                    clock = list(map(max, clock, other))
            clock[lane] = count[lane]
            self.where[op.id] = (lane, count[lane])
            count[lane] += 1
            self.clock[op.id] = tail[lane] = clock

    def waits_for(self, later: str, earlier: str) -> bool:
        """Whether `later` starts only after `earlier` ended (True for the same op)."""
        lane, pos = self.where[earlier]
        return self.clock[later][lane] >= pos


def check_tenancy(ops: Sequence[Op], order: Order) -> str | None:
    """One tenant per slot at a time; the next acquirer waits for the last releaser. Returns
    the first violation, or None."""
    holder: dict[str, str] = {}  # slot -> acquiring op id, while held
    last_release: dict[str, str] = {}  # slot -> op id that released it last
    for op in ops:
        for s in op.acquires:
            if s in holder:
                return f"op {op.id}: acquires {s!r} still held by {holder[s]}"
            prev = last_release.get(s)
            if prev is not None and not order.waits_for(op.id, prev):
                return f"op {op.id}: reuses slot {s!r} without depending on its release by {prev}"
            holder[s] = op.id
        for s in op.releases:
            if holder.pop(s, None) is None:
                return f"op {op.id}: releases {s!r} which is not held"
            last_release[s] = op.id
    if holder:
        s, acq = next(iter(holder.items()))
        return f"op {acq}: acquires {s!r} which no later op releases"
    return None


def check_dataflow(
    ops: Sequence[Op], order: Order, slots: Mapping[str, int], static: Collection[str]
) -> str | None:
    """Every value in a known slot; reads wait for their writer; writers ordered. Returns the
    first violation, or None."""
    writer: dict[tuple[str, str], str] = {}
    for op in ops:
        for v in op.reads:
            if (problem := _read(op, v.name, v.slot, writer, order, slots, static)) is not None:
                return problem
        for v in op.writes:
            key = (v.name, v.slot)
            if (
                v.accumulate
                and (problem := _read(op, v.name, v.slot, writer, order, slots, static)) is not None
            ):
                return problem
            if v.slot not in slots:
                return f"op {op.id}: writes {v} in unknown slot {v.slot!r}"
            prev = writer.get(key)
            if prev is not None and not order.waits_for(op.id, prev):
                return f"op {op.id}: writes {v}, unordered with {prev} which writes it too"
            writer[key] = op.id
    return None


def _read(
    op: Op,
    name: str,
    slot: str,
    writer: Mapping[tuple[str, str], str],
    order: Order,
    slots: Mapping[str, int],
    static: Collection[str],
) -> str | None:
    if slot not in slots:
        return f"op {op.id}: reads {name}@{slot} in unknown slot {slot!r}"
    prev = writer.get((name, slot))
    if prev is None:
        if slot in static:
            return None  # the initial state
        return f"op {op.id}: reads {name}@{slot}, which no earlier op writes"
    if prev != op.id and not order.waits_for(op.id, prev):
        return f"op {op.id}: reads {name}@{slot} without waiting for its writer {prev}"
    return None
