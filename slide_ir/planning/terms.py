"""A ledger's terms: one pool of the schedule IR each, with the label a user reads and the formula
it came from, and the collector that the term builders (`compute_terms`, `state_terms`,
`transfer_terms`) add them to.

Invariant: a term is never empty (the collector drops zero slots or zero bytes), so a ledger's
breakdown lists only what is allocated; a pool's dtype is its role's (`ROLE_DTYPES`) unless the
builder says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from slide_ir.ir.graph import Dtype, Pool, Tier
from slide_ir.ir.graph import PoolRole as R
from slide_ir.planning.units import unit_params
from slide_ir.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Term:
    pool: Pool
    label: str  # what a user reads: "fp32 master weights"
    formula: str  # how it was computed: "4 B x 7.50e9 params"

    @property
    def bytes(self) -> int:
        return self.pool.bytes

    @property
    def report_tier(self) -> str:
        return "cpu" if self.pool.tier in (Tier.CPU, Tier.PINNED) else str(self.pool.tier)


# what a pool of each role holds, element by element (a pool that differs says so: `add`)
ROLE_DTYPES = {R.HIDDEN: Dtype.COMPUTE, R.HIDDEN_GRAD: Dtype.COMPUTE, R.HOST_HIDDEN: Dtype.COMPUTE,
               R.UNIT: Dtype.COMPUTE, R.DEVICE_WEIGHTS: Dtype.COMPUTE,
               R.DEVICE_GRADS: Dtype.COMPUTE, R.GRAD_LANDING: Dtype.COMPUTE,
               R.HOST_WEIGHTS: Dtype.COMPUTE, R.WEIGHT_STAGING: Dtype.COMPUTE,
               R.GRAD_ACCUM: Dtype.FP32, R.MASTER: Dtype.FP32, R.MASTER_STAGING: Dtype.FP32, R.MOMENTS: Dtype.MOMENTS, R.GRAD_NORMS: Dtype.FP32, R.GRAD_SCALE: Dtype.FP32,
               R.TOKENS: Dtype.INT64, R.HOST_TOKENS: Dtype.INT64, R.NVME_HIDDEN: Dtype.COMPUTE,
               R.LOSSES: Dtype.FP32, R.HOST_LOSSES: Dtype.FP32}  # fmt: skip


class Terms:
    """Collects terms; skips empty ones so the breakdown lists only what is allocated."""

    def __init__(self) -> None:
        self.items: list[Term] = []

    def add(
        self,
        name: str,
        tier: Tier,
        slots: int,
        slot_bytes: int,
        label: str,
        formula: str,
        *,
        static: bool = False,
        role: R = R.ACCOUNTING,
        units: tuple[int, ...] = (),
        offsets: tuple[int, ...] = (),
        dtype: Dtype | None = None,
        shape: tuple[int, ...] = (),
    ) -> None:
        if slots > 0 and slot_bytes > 0:
            dtype = ROLE_DTYPES.get(role, Dtype.NONE) if dtype is None else dtype
            pool = Pool(name=name, tier=tier, slots=slots, slot_bytes=slot_bytes, static=static,
                        role=role, units=units, offsets=offsets, dtype=dtype, shape=shape)  # fmt: skip
            self.items.append(Term(pool=pool, label=label, formula=formula))

    def add_group(
        self,
        name: str,
        tier: Tier,
        members: list[int],
        params: int,
        per_param: int,
        label: str,
        *,
        role: R,
        static: bool = True,
    ) -> None:
        """A slot per unit of a group of same-sized units (`unit_groups`), each unit `params`
        parameters at `per_param` bytes."""
        k = len(members)
        self.add(name, tier, k, params * per_param, label,
                 f"{k} x {params:.4g} params x {per_param} B", static=static, role=role,
                 units=tuple(members))  # fmt: skip


def unit_groups(model: ModelSpec, units: list[int]) -> Iterator[tuple[str, list[int]]]:
    """Units of equal size share a pool: embedding, decoder layers, head."""
    n = model.num_layers
    groups = {
        "embed": [u for u in units if u == 0],
        "layers": [u for u in units if 1 <= u <= n],
        "head": [u for u in units if u == n + 1],
    }
    for name, members in groups.items():
        if members and unit_params(model, members[0]) > 0:
            yield name, members
