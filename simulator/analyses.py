"""Questions asked before buying hardware, answered by planning and simulating many points.

- `critical_batch`: the smallest batch with eta >= 1 (the CPU update and gradient download hide
  behind the GPU backward) and the smallest with GPU busy >= 97% of the backward phase;
- `batch_sweep`, `model_sweep`, `nvme_sweep`, `schedule_sweep`: one row (a `SimResult.summary()`)
  per point;
- `compare`: machines ranked by throughput, and per dollar where the profile has a price.

Capacity (what fits at all) lives in `slide_ir.planning.capacity`. Every point is planned by the same
planner and priced by the same cost model: no analysis has a formula of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from simulator.run import SimResult, resolve_machine, resolve_model, simulate_plan
from slide_ir.planning.placement import plan_fits
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

log = logging.getLogger(__name__)
UTIL_TARGET = 0.97
MAX_BATCH = 512
Row = dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class CriticalBatch:
    critical_batch: int | None  # smallest batch with eta >= 1; None: not reached while it fits
    critical_batch_util97: int | None  # smallest with GPU backward utilisation >= 97%
    max_feasible_batch: int  # largest batch whose plan fits (0: none; capped at the search limit)
    ignore_memory: bool  # whether batches that do not fit were simulated anyway (what-if)
    points: dict[int, Row]  # every batch simulated on the way

    def summary(self) -> Row:
        return {
            "critical_batch": self.critical_batch,
            "critical_batch_util97": self.critical_batch_util97,
            "max_feasible_batch": self.max_feasible_batch,
            "ignore_memory": self.ignore_memory,
            "points": [self.points[b] for b in sorted(self.points)],
        }


def critical_batch(
    model: str | ModelSpec,
    machine: str | Machine,
    config: TrainConfig,
    *,
    max_batch: int = MAX_BATCH,
    ignore_memory: bool = False,
) -> CriticalBatch:
    """Exponential then binary search over batch (eta and backward utilisation grow with batch:
    T_bwd scales with it, T_d2h and T_update do not). `config.batch` is ignored.

    `ignore_memory` simulates batches whose plan overflows a tier as if it fitted: eta is a ratio
    of per-layer costs and does not depend on how much memory there is, so this answers "where
    is the crossover" even when the GPU cannot hold that batch. Memory ignored, the host weights
    keep their pinned copy (`host_weights="auto"` would cast them where nothing fits, the
    smaller footprint, which the question does not need).
    """
    spec, mach = resolve_model(model), resolve_machine(machine)
    if ignore_memory and config.host_weights == "auto":
        config = replace(config, host_weights="pinned")
    points: dict[int, Row] = {}

    def row(batch: int) -> Row:
        if batch not in points:
            cfg = replace(config, batch=batch)
            points[batch] = simulate_plan(spec, mach, cfg, force=ignore_memory).summary()
        return points[batch]

    def usable(r: Row) -> bool:
        return bool(r["feasible"]) or ignore_memory

    def eta_ok(r: Row) -> bool:
        return r["eta"] is None or r["eta"] >= 1.0

    def util_ok(r: Row) -> bool:
        return bool(r["gpu_bwd_util"] >= UTIL_TARGET)

    largest = _largest_fitting(spec, mach, config, max_batch)
    return CriticalBatch(
        critical_batch=_smallest(row, usable, eta_ok, max_batch),
        critical_batch_util97=_smallest(row, usable, util_ok, max_batch),
        max_feasible_batch=largest,
        ignore_memory=ignore_memory,
        points=points,
    )


def _largest_fitting(spec: ModelSpec, mach: Machine, config: TrainConfig, limit: int) -> int:
    """Largest batch in [1, limit] whose plan fits (0 if none), by the planner's own placement
    search (`plan_fits`), so its "auto" choices (resident units, activations on the GPU) count
    as they do in `slide plan`: a ledger with the activations forced to the host overflows the
    host first (8B on the H200: 35 against 60). The answer fits and the next batch does not
    (or it is `limit`)."""

    def ok(batch: int) -> bool:
        return plan_fits(spec, mach, replace(config, batch=batch))

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi < limit and ok(hi):
        lo, hi = hi, min(2 * hi, limit)
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _smallest(
    row: Callable[[int], Row],
    usable: Callable[[Row], bool],
    ok: Callable[[Row], bool],
    limit: int,
) -> int | None:
    """Smallest usable batch in [1, limit] satisfying `ok`, or None.

    Both properties are monotone in batch (usable: up to some size; ok: from some size), so
    "unusable or ok" is monotone too: search its first true batch, then check it is usable.
    """

    def stop(b: int) -> bool:
        r = row(b)
        return not usable(r) or ok(r)

    lo, hi = 0, 1  # lo: known false (0 by convention); hi: candidate
    while not stop(hi):
        if hi >= limit:
            return None
        lo, hi = hi, min(2 * hi, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stop(mid):
            hi = mid
        else:
            lo = mid
    return hi if usable(row(hi)) else None


def batch_sweep(
    model: str | ModelSpec, machine: str | Machine, config: TrainConfig, batches: Iterable[int]
) -> list[Row]:
    spec, mach = resolve_model(model), resolve_machine(machine)
    return [simulate_plan(spec, mach, replace(config, batch=b)).summary() for b in batches]


def model_sweep(
    models: Iterable[str | ModelSpec], machine: str | Machine, config: TrainConfig
) -> list[Row]:
    mach = resolve_machine(machine)
    return [simulate_plan(m, mach, config).summary() for m in models]


def nvme_sweep(
    model: str | ModelSpec,
    machine: str,
    config: TrainConfig,
    drives: Iterable[int],
    *,
    ram_gb: float | None = None,
) -> list[Row]:
    """Throughput against the number of NVMe drives (the machine's drive model, repeated)."""
    spec = resolve_model(model)
    rows = []
    for n in drives:
        row = simulate_plan(spec, resolve_machine(machine, ram_gb=ram_gb, nvme=n), config).summary()
        rows.append({"nvme_drives": n, **row})
    return rows


def schedule_sweep(
    model: str | ModelSpec,
    machine: str | Machine,
    config: TrainConfig,
    schedules: Sequence[str] = ("sliding", "zero-offload", "gpu-only"),
) -> list[Row]:
    """The same point under each schedule: the gain of overlap, side by side."""
    spec, mach = resolve_model(model), resolve_machine(machine)
    return [simulate_plan(spec, mach, replace(config, schedule=s)).summary() for s in schedules]


def compare(
    model: str | ModelSpec,
    machines: Iterable[str | Machine],
    config: TrainConfig,
) -> list[Row]:
    """Machines ranked by tokens/s (infeasible last); `tokens_per_s_per_usd` where priced."""
    spec = resolve_model(model)
    rows = []
    for machine in machines:
        mach = resolve_machine(machine)
        result: SimResult = simulate_plan(spec, mach, config)
        row = result.summary()
        price = getattr(mach, "price_usd", None)
        row["price_usd"] = price
        tps = row.get("tokens_per_s")
        row["tokens_per_s_per_usd"] = tps / price if tps and price else None
        rows.append(row)
    rows.sort(key=lambda r: -(r.get("tokens_per_s") or 0.0))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    by_value = sorted(
        (r for r in rows if r["tokens_per_s_per_usd"]), key=lambda r: -r["tokens_per_s_per_usd"]
    )
    for rank, row in enumerate(by_value, start=1):
        row["rank_per_usd"] = rank
    return rows
