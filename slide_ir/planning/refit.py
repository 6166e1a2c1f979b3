"""Online re-planning: a machine profile re-fit to a run's measured lanes, and the plan it asks for.

A plan is as good as the profile it was priced with, and a profile measured elsewhere (a catalog
preset, another machine of the kind, a host busy with something else) can be off by 15% or more
on one lane while right on the others; the plan it gives then slides, streams or keeps the wrong
units. After the first steady steps of a run, each lane kind's measured busy time is set against
what the profile predicts for the same ops (`lane_factors`: measured / predicted), for the lanes
whose predicted time is mostly rate-bound (`fixed_shares`; a GPU lane bound by its dispatch
floors re-fits the floors instead: `floor_factors`); every rate of that lane's part of the
machine is divided by its factor (`refit_machine`), and the placement search runs again on the
re-fit profile, under the same memory budget (`replan`). The running
plan is kept unless the new choice is predicted at least `MIN_GAIN` faster than it on that same
re-fit profile, so measurement noise does not move a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from slide_ir.ir.graph import lane_kind
from slide_ir.planning.cost import FLOOR_FIELDS, FLOOR_KINDS, CostModel
from slide_ir.planning.host_rates import GRID_FIELDS, refit_grid
from slide_ir.planning.planner import Plan, plan
from slide_ir.planning.speculation import expected
from slide_ir.planning.timeline import predict, predict_step_s
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware_parts import Machine, freeze_sources, scale_grid

MIN_GAIN = 0.03  # re-plan when the new choice is predicted this much faster (share of a step)
FACTOR_RANGE = (0.1, 10.0)  # a lane measured outside this is a fault, not a rate: left alone
# A lane whose predicted time is at least this share fixed cost (launches, dispatch floors) says
# nothing about its rates: batch 1 x seq 128 of llama-3.2-1b measured its GPU lane at 3.3x the
# rates' time, which would have cut the cached profile's GPU rates 3.3-fold.
MAX_FIXED_SHARE = 0.5
# A lane busy for less of the steps than this says little about its rates, and what it says
# is kept for every later plan of the shape: on the H200, 2 host-updated layers of a 3B step
# (8% of it) re-fit the CPU at 0.40x its time, and the next run, planned on that, slid 26
# layers and ran 54% slower than predicted.
MIN_BUSY_SHARE = 0.2
P = TypeVar("P")


@dataclass(frozen=True, kw_only=True, slots=True)
class Replanned:
    """The outcome of one re-planning check (`plan` None: the running plan stays)."""

    factors: dict[str, float]  # lane kind -> measured / predicted busy; floor field -> factor
    running_s: float  # the running plan's step on the re-fit profile
    best_s: float  # the search's choice on the re-fit profile
    plan: Plan | None
    reason: str

    def summary(self) -> dict[str, object]:
        return {
            "factors": {k: round(v, 4) for k, v in sorted(self.factors.items())},
            "running_step_s": round(self.running_s, 4),
            "best_step_s": round(self.best_s, 4),
            "replanned": self.plan is not None,
            "reason": self.reason,
        }


def step_costs(p: Plan, machine: Machine | None = None) -> tuple[CostModel, CostModel]:
    """The cost model of a step that keeps its speculated updates and of one that rolls them
    back (the same where nothing speculates), on `machine` (default: `p`'s profile)."""
    kept = CostModel(machine or p.machine, cpu_threads=p.config.cpu_threads)
    return kept, kept.rolling_back() if p.config.speculated else kept


def expected_step_s(p: Plan, costs: tuple[CostModel, CostModel], share: float) -> float:
    """`p`'s predicted step with `share` of its steps rolling their speculation back."""
    kept, back = costs
    step_s = predict_step_s(p.graph, kept)
    return expected(step_s, predict_step_s(p.graph, back), share) if back is not kept else step_s


def predicted_busy(
    p: Plan, steps: set[int], rolled_back: AbstractSet[int] = frozenset()
) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds of op time that `p`'s profile predicts over `steps` of its graph: per lane kind,
    and per op kind (one prediction for both). The steps in `rolled_back` are priced as steps
    that rolled their speculated updates back (a redone update is a whole update)."""
    kept, back = step_costs(p)
    kept_trace = predict(p.graph, kept)
    back_trace = predict(p.graph, back) if back is not kept and rolled_back & steps else kept_trace
    spans = [s for s in kept_trace.spans if s.step in steps - rolled_back]
    spans += [s for s in back_trace.spans if s.step in steps & rolled_back]
    by_lane: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    for s in spans:
        by_lane[lane_kind(s.lane)] = by_lane.get(lane_kind(s.lane), 0.0) + s.duration
        by_kind[s.kind] = by_kind.get(s.kind, 0.0) + s.duration
    return by_lane, by_kind


def fixed_shares(
    p: Plan, steps: set[int], rolled_back: AbstractSet[int] = frozenset()
) -> dict[str, float]:
    """Per lane kind, the share of `p`'s predicted op time over `steps` that no rate scales
    (`CostModel.fixed_seconds`: launches, and dispatch floors where they bind)."""
    kept, back = step_costs(p)
    fixed: dict[str, float] = {}
    total: dict[str, float] = {}
    for op in p.graph.ops:
        if op.step in steps:
            costs = back if op.step in rolled_back else kept
            kind = lane_kind(op.lane)
            fixed[kind] = fixed.get(kind, 0.0) + costs.fixed_seconds(op)
            total[kind] = total.get(kind, 0.0) + costs.seconds(op)
    return {kind: fixed[kind] / seconds for kind, seconds in total.items() if seconds > 0}


def floor_factors(
    p: Plan, steps: set[int], measured: Mapping[str, float], predicted: Mapping[str, float]
) -> dict[str, float]:
    """Per dispatch floor of `p`'s GPU (`FLOOR_KINDS`), the factor that gives the measured busy
    time of the op kinds it bounds (`measured` and `predicted`: seconds per op kind over
    `steps`): their whole gap between measured and predicted put on the floors that bind (those
    ops' time is their floor). A floor none of whose ops it binds, or whose factor lies outside
    `FACTOR_RANGE`, gets none."""
    costs = CostModel(p.machine, cpu_threads=p.config.cpu_threads)
    binding: dict[str, float] = {}
    for op in p.graph.ops:
        if op.step in steps:
            binding[op.kind] = binding.get(op.kind, 0.0) + costs.binding_floor(op)
    lo, hi = FACTOR_RANGE
    factors = {}
    for field, kinds in FLOOR_KINDS.items():
        floors_s = sum(binding.get(k, 0.0) for k in kinds)
        gap = sum(measured.get(k, 0.0) - predicted.get(k, 0.0) for k in kinds)
        if floors_s > 0 and lo <= 1.0 + gap / floors_s <= hi:
            factors[field] = 1.0 + gap / floors_s
    return factors


def lane_factors(measured: Mapping[str, float], predicted: Mapping[str, float]) -> dict[str, float]:
    """measured / predicted busy seconds per lane kind (lanes of a kind summed: nvme0 + nvme1),
    for the kinds both have some time on and whose ratio lies within `FACTOR_RANGE`."""
    by_kind: dict[str, float] = {}
    for lane, seconds in measured.items():
        by_kind[lane_kind(lane)] = by_kind.get(lane_kind(lane), 0.0) + seconds
    lo, hi = FACTOR_RANGE
    factors = {}
    for kind, seconds in by_kind.items():
        want = predicted.get(kind, 0.0)
        if want > 0 and seconds > 0 and lo <= seconds / want <= hi:
            factors[kind] = seconds / want
    return factors


def refit_machine(machine: Machine, factors: Mapping[str, float]) -> Machine:
    """`machine` with each lane's rates divided by its factor (a lane measured 10% slow gets
    rates 10% lower), the measured grids of those rates with them (a grid point is a rate at a
    shape or size), and each GPU dispatch floor multiplied by its own factor (keyed by its
    field); the sources say so."""
    sources = dict(machine.sources)

    def scaled(part: P, prefix: str, fields: tuple[str, ...], kind: str) -> P:
        factor = factors.get(kind)
        if factor is None:
            return part
        new = {f: _divided(part, f, factor) for f in fields if getattr(part, f) is not None}
        try:
            fitted = cast(P, replace(cast(Any, part), **new))
        except ValueError:  # past what the part's own checks allow (matmul over its peak)
            return part
        for f in new:
            sources[f"{prefix}.{f}"] = f"re-fit to a run's measured {kind} lane: / {factor:.4f}"
        return fitted

    link = scaled(machine.link, "link", _UPLOAD_RATES, "h2d")
    link = scaled(link, "link", _DOWNLOAD_RATES, "d2h")
    duplex = [factors[k] for k in ("h2d", "d2h") if k in factors]
    if duplex:
        link = replace(link, duplex_bytes_per_s=link.duplex_bytes_per_s / max(duplex))
        sources["link.duplex_bytes_per_s"] = (
            f"re-fit to a run's measured copy lanes: / {max(duplex):.4f}"
        )
    gpu = scaled(machine.gpu, "gpu", _GPU_RATES, "gpu")
    floors = {f: getattr(gpu, f) * factors[f] for f in FLOOR_FIELDS
              if f in factors and getattr(gpu, f) is not None}  # fmt: skip
    gpu = replace(gpu, **floors)
    for f in floors:
        sources[f"gpu.{f}"] = f"re-fit to a run's measured ops it bounds: x {factors[f]:.4f}"
    return replace(
        machine,
        gpu=gpu,
        cpu=scaled(machine.cpu, "cpu", _CPU_RATES, "cpu"),
        link=link,
        nvme=tuple(scaled(d, "nvme", _DRIVE_RATES, "nvme") for d in machine.nvme),
        sources=freeze_sources(sources),
    )


def _divided(part: Any, name: str, factor: float) -> float | str:
    """`part`'s rate `name` divided by `factor`; a GPU grid's every rate with it; a host grid
    moved as its curve's rate part is (`host_rates.refit_grid`: its fixed cost stays)."""
    if name in GRID_FIELDS:
        return refit_grid(part, name, factor)
    value = getattr(part, name)
    return scale_grid(value, 1 / factor) if isinstance(value, str) else float(value) / factor


# Each lane's rates and the grids measured with them (`*_grid`: points that move with the rates)
_GPU_RATES = (
    "bf16_matmul_tflops",
    "attention_tflops",
    "masked_attention_tflops",
    "hbm_bytes_per_s",
    "lce_logits_per_s",
    "elementwise_bytes_per_s",
    "adam_elems_per_s",
    "gemm_grid",
    "attention_grid",
)
_CPU_RATES = (
    "adam_elems_per_s_per_core",
    "cast_elems_per_s_per_core",
    "dram_bytes_per_s",
    "dram_under_dma_bytes_per_s",
    "adam_grid",
)
_UPLOAD_RATES = ("h2d_bytes_per_s", "pageable_h2d_bytes_per_s", "h2d_grid")
_DOWNLOAD_RATES = ("d2h_bytes_per_s", "pageable_d2h_bytes_per_s", "d2h_grid")
_DRIVE_RATES = ("read_bytes_per_s", "write_bytes_per_s", "read_grid", "write_grid")


def fitted_factors(
    running: Plan,
    measured: Mapping[str, float],
    steps: set[int],
    by_kind: Mapping[str, float],
    rolled_back: AbstractSet[int] = frozenset(),
) -> dict[str, float]:
    """`lane_factors` for the lanes mostly rate-bound and busy for at least `MIN_BUSY_SHARE`
    of the steps; for a GPU lane mostly bound by its dispatch floors, `floor_factors` instead
    (from `by_kind`, busy seconds per op kind): a small model's run teaches the profile how long
    its host takes to issue a layer, not how fast its GPU computes."""
    bound = {kind for kind, share in fixed_shares(running, steps, rolled_back).items()
             if share >= MAX_FIXED_SHARE}  # fmt: skip
    by_lane, predicted_by_kind = predicted_busy(running, steps, rolled_back)
    wall_s = len(steps) * predict_step_s(running.graph, step_costs(running)[0])
    bound |= {kind for kind, seconds in by_lane.items() if seconds < MIN_BUSY_SHARE * wall_s}
    factors = {k: v for k, v in lane_factors(measured, by_lane).items() if k not in bound}
    if "gpu" in bound:
        factors |= floor_factors(running, steps, by_kind, predicted_by_kind)
    return factors


def replan(
    running: Plan,
    request: TrainConfig,
    measured: Mapping[str, float],
    steps: set[int],
    by_kind: Mapping[str, float],
    rolled_back: AbstractSet[int] = frozenset(),
) -> Replanned:
    """Whether `running` (a plan of `request`, its "auto" choices unresolved) should give way
    to the search's choice on the profile re-fit from `measured` (busy seconds per lane over
    `steps` of `running.graph`; `rolled_back`: those of them that rolled speculated updates
    back). Plans that speculate are timed at the share of the steps that rolled back. The new
    plan has `running`'s steps."""
    factors = fitted_factors(running, measured, steps, by_kind, rolled_back)
    machine = refit_machine(running.machine, factors)
    share = len(rolled_back & steps) / len(steps) if steps else 0.0
    running_s = expected_step_s(running, step_costs(running, machine), share)
    best = plan(running.model, machine, replace(request, steps=running.config.steps))
    best_s = expected_step_s(best, step_costs(best, machine), share)
    chosen = best.choice.chosen if best.choice else None
    was = running.choice.chosen if running.choice else None
    same = chosen == was and best.config.speculate == running.config.speculate
    if not best.feasible or chosen is None or same:
        return Replanned(factors=factors, running_s=running_s, best_s=best_s, plan=None,
                         reason="the search chooses the running placement again")  # fmt: skip
    gain = 1.0 - best_s / running_s
    if gain < MIN_GAIN:
        return Replanned(factors=factors, running_s=running_s, best_s=best_s, plan=None,
                         reason=f"{chosen.describe(running.model)} predicted only "
                                f"{gain:.1%} faster")  # fmt: skip
    return Replanned(
        factors=factors,
        running_s=running_s,
        best_s=best_s,
        plan=best,
        reason=f"{chosen.describe(running.model)} predicted {gain:.1%} faster on the measured rates",
    )
