"""GraphBuilder: emits ops in list order and assigns pool slots as rings.

Schedules are written as straight-line code that emits ops roughly in the order they will run.
Slots are handed out first-freed, first-reused: acquiring a slot adds a dependency on the op that
released it last, which is how "wait until a cache unit is free" becomes an ordinary dependency.
A value an op writes into a slot it acquires is given as `Taken(name)` (the slot is not known
before the op is emitted); `micro` is the micro-batch the ops emitted next belong to. `tails`
names the last op each lane has emitted of a step: what waits for the whole step waits for them
(each lane runs its ops in list order).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from slide_ir.ir.graph import Graph, GraphInfo, Op, OpKind, Pool, Role, Value, Work

NO_WORK = Work()  # an op that costs nothing (frozen: one shared instance)


class PlanningError(RuntimeError):
    """A schedule asked for more slots than its pool holds: a bug in the schedule, not the input."""


@dataclass(frozen=True, slots=True)
class Taken:
    """A value written into the slot the op takes from its `index`-th `acquire` pool."""

    name: str
    index: int = 0
    accumulate: bool = False
    role: Role = Role.MAIN


class GraphBuilder:
    def __init__(self, pools: Iterable[Pool]) -> None:
        self.pools = tuple(pools)
        self.ops: list[Op] = []
        self.micro = 0
        # free slots per pool, oldest release first: (slot id, releasing op id or None)
        self._free: dict[str, deque[tuple[str, str | None]]] = {
            p.name: deque((s, None) for s in p.slot_ids()) for p in self.pools if not p.static
        }
        self._tails: dict[int, dict[str, str]] = {}  # step -> lane -> its last op of the step

    def emit(
        self,
        op_id: str,
        kind: OpKind,
        lane: str,
        *,
        step: int,
        unit: int,
        work: Work | None = None,
        deps: Iterable[str | None] = (),
        acquire: Iterable[str] = (),
        release: Iterable[str | None] = (),
        scratch: Iterable[str] = (),
        reads: Iterable[Value | None] = (),
        writes: Iterable[Value | Taken | None] = (),
    ) -> tuple[str, ...]:
        """Append an op. `acquire` names pools (held until a later op releases the slot),
        `release` names slots, `scratch` names pools whose slot the op holds only while it
        runs; `reads` and `writes` its operands (None: absent). Returns the slots acquired
        from `acquire`, in order."""
        dep_list = [d for d in deps if d]
        slots: list[str] = []
        scratch_slots: list[str] = []
        for pools, out in ((acquire, slots), (scratch, scratch_slots)):
            for pool in pools:
                slot, released_by = self._take(pool, op_id)
                out.append(slot)
                if released_by:
                    dep_list.append(released_by)
        freed = [s for s in release if s] + scratch_slots
        for slot in freed:
            self._free[slot.rpartition(".")[0]].append((slot, op_id))
        placed = [
            Value(name=v.name, slot=slots[v.index], accumulate=v.accumulate, role=v.role)
            if isinstance(v, Taken)
            else v
            for v in writes
            if v is not None
        ]
        self.ops.append(
            Op(
                id=op_id,
                kind=kind,
                lane=lane,
                step=step,
                unit=unit,
                micro=self.micro,
                work=work or NO_WORK,
                deps=tuple(dict.fromkeys(dep_list)) if len(dep_list) > 1 else tuple(dep_list),
                acquires=tuple(slots + scratch_slots),
                releases=tuple(freed),
                reads=tuple([r for r in reads if r is not None]),
                writes=tuple(placed),
            )
        )
        self._tails.setdefault(step, {})[lane] = op_id
        return tuple(slots)

    def tails(self, step: int) -> tuple[str, ...]:
        """The last op of `step` emitted so far on each lane (none for a step not emitted)."""
        return tuple(self._tails.get(step, {}).values())

    def _take(self, pool: str, op_id: str) -> tuple[str, str | None]:
        free = self._free.get(pool)
        if free is None:
            raise PlanningError(f"op {op_id}: no slotted pool named {pool!r}")
        if not free:
            raise PlanningError(f"op {op_id}: pool {pool!r} has no free slot at this point")
        return free.popleft()

    def build(self, info: GraphInfo, *, check: bool = True) -> Graph:
        """The graph; `check=False`: without its construction checks (`Graph.unchecked`)."""
        make = Graph if check else Graph.unchecked
        return make(info=info, pools=self.pools, ops=tuple(self.ops))
