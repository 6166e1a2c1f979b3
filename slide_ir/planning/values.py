"""Names of the values ops read and write, and where a unit's fixed homes are.

A value is (name, slot) (`slide_ir.ir.graph.Value`). Names say what a value is, independent of
where it sits: per unit `L3.w` (compute-dtype weights), `L3.g` (their gradient), `L3.master`,
`L3.moments` (FP32 master, Adam moments), `L3.state` (master + moments together, on the GPU),
`L3.state1` (stripe 1 of the state on NVMe), `L3.gacc` (FP32 gradient accumulator); per
micro-batch `s1.L3.x` (unit 3's input hidden state), `s1.L3.dx` (its gradient), `s1.L3.tape`
(the autograd tape a recompute leaves for the backward), `s1.tokens` (token ids and labels);
with several micro-batches these carry `m1.` after the step, like op ids.

Static pools that hold one unit per slot (`Pool.units`) are a unit's fixed homes: its pinned
weights, master, moments, NVMe state, resident slot. `unit_homes` maps (role, unit) to them.
"""

from __future__ import annotations

from collections.abc import Iterable

from slide_ir.ir.graph import Pool, PoolRole, Role, Value, slot_id


def weights(unit: int) -> str:
    return f"L{unit}.w"


def grads(unit: int) -> str:
    return f"L{unit}.g"


def unit_value(unit: int, what: str) -> str:
    """`L3.master`, `L3.moments`, `L3.state`, `L3.state1`, `L3.gacc`."""
    return f"L{unit}.{what}"


def micro_prefix(step: int, micro: int, grad_accum: int) -> str:
    return f"s{step}.m{micro}." if grad_accum > 1 else f"s{step}."


def unit_homes(pools: Iterable[Pool]) -> dict[tuple[PoolRole, int], str]:
    """(role, unit) -> slot, for static pools: slot i of a pool with one slot per unit holds
    `units[i]`; a pool with one slot and several units holds them all side by side."""
    out: dict[tuple[PoolRole, int], str] = {}
    for p in pools:
        if not p.static or not p.units:
            continue
        if p.slots == len(p.units):
            out.update({(p.role, u): slot_id(p.name, i) for i, u in enumerate(p.units)})
        elif p.slots == 1:
            out.update({(p.role, u): slot_id(p.name, 0) for u in p.units})
    return out


def at(name: str, slot: str, *, accumulate: bool = False, role: Role = Role.MAIN) -> Value:
    return Value(name=name, slot=slot, accumulate=accumulate, role=role)
