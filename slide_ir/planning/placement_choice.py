"""What a placement is and what choosing one reports: `Placement` (how many units are resident,
streamed and sliding, where the layer inputs live, the cache depth, the kept tapes),
`Candidate` (a placement with its predicted steady step and GPU footprint) and
`PlacementChoice` (the one chosen, how, and every candidate timed), which the planner resolves
into its TrainConfig and `slide plan` reports.

Candidates rank by predicted steady step; steps equal to TIE_DIGITS significant digits (one
critical path summed in another order) rank by GPU footprint, then by placement, so the choice
does not depend on the order in which the search timed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from slide_ir.planning.ledger import Ledger
from slide_ir.planning.units import resident_preference
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

TIE_DIGITS = 9


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class Placement:
    activations: str
    cache_units: int
    resident: int  # the first units of `resident_preference`
    streamed: int  # the next ones
    kept: int = 0  # the top decoder layers whose forward keeps its tape (no recompute)
    lean: bool = False  # `TrainConfig.lean_buffers`: the host's copy buffers one deep

    def units(self, model: ModelSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(resident units, streamed units)."""
        order = resident_preference(model)
        rest = order[self.resident :]
        return order[: self.resident], rest[: self.streamed]

    def describe(self, model: ModelSpec) -> str:
        sliding = len(resident_preference(model)) - self.resident - self.streamed
        depth = f", {self.cache_units} cache units" if sliding else ""
        lean = "; lean host buffers (one landing and one cast slot)" if self.lean else ""
        return (
            f"{self.resident} resident, {self.streamed} streamed, {sliding} sliding units; "
            f"inputs on {self.activations}{depth}; {self.kept} kept tapes{lean}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    placement: Placement
    step_s: float  # predicted steady step; inf when it does not fit (never timed)
    gpu_bytes: int

    @property
    def fits(self) -> bool:
        return math.isfinite(self.step_s)

    def rank(self) -> tuple[float, int, Placement]:
        """Faster first; steps equal to TIE_DIGITS significant digits (one critical path
        summed in another order) rank by GPU footprint, then by placement."""
        return float(f"{self.step_s:.{TIE_DIGITS}g}"), self.gpu_bytes, self.placement


@dataclass(frozen=True, kw_only=True, slots=True)
class PlacementChoice:
    chosen: Placement
    # "searched": fastest of `considered`; "pinned": nothing was left to choose; "small":
    # `placement="small"`; "schedule": a baseline schedule (nothing slides); "nothing fits":
    # no candidate fits, the smallest footprint is shown
    how: str
    considered: tuple[Candidate, ...] = ()  # every candidate timed, fastest first
    legacy: Placement | None = (
        None  # the rule before the search: no resident units, streamed by estimate
    )
    ledger: Ledger | None = None  # the chosen placement's, when the search built it
    # under global clipping, the host updates each candidate was timed with speculating (the
    # plan then chooses its own count for the chosen placement: `speculation`)
    timed_speculated: int = 0

    @property
    def predicted_step_s(self) -> float | None:
        return next((c.step_s for c in self.considered if c.placement == self.chosen), None)

    @property
    def runner_up(self) -> Candidate | None:
        """The fastest candidate that places units or inputs otherwise (another cache depth or
        count of kept tapes of the choice only when there is none: one tape more or less, or
        the depth, rarely matters by more than a few %)."""
        others = [c for c in self.considered if c.placement != self.chosen]
        same = {"cache_units": self.chosen.cache_units, "kept": self.chosen.kept}
        moved = [c for c in others if replace(c.placement, **same) != self.chosen]  # type: ignore[arg-type]
        return next(iter(moved or others), None)

    def candidate(self, placement: Placement | None) -> Candidate | None:
        return next((c for c in self.considered if c.placement == placement), None)

    def summary(self, model: ModelSpec) -> dict[str, object]:
        """JSON-ready: what was chosen and how, with the predicted steps of the choice, the
        runner-up, the rule before the search (None where not timed) and the three fastest."""
        runner = self.runner_up
        return {
            "how": self.how,
            "chosen": _entry(model, self.chosen, self.predicted_step_s),
            "runner_up": runner and _entry(model, runner.placement, runner.step_s),
            "legacy": self.legacy and _entry(model, self.legacy, self._step_of(self.legacy)),
            "candidates": len(self.considered),
            "top": [_entry(model, c.placement, c.step_s) for c in self.considered[:3]],
        }

    def _step_of(self, placement: Placement) -> float | None:
        found = self.candidate(placement)
        return found.step_s if found else None

    def resolve(self, config: TrainConfig) -> TrainConfig:
        """`config` with every "auto" replaced by the choice (re-planning it gives this plan)."""
        p = self.chosen
        return replace(
            config,
            activations=p.activations,
            cache_units=p.cache_units,
            resident=p.resident,
            streamed=p.streamed,
            keep_activations=p.kept,
            lean_buffers=p.lean,
        )


def _entry(model: ModelSpec, p: Placement, step_s: float | None) -> dict[str, object]:
    resident, streamed = p.units(model)
    return {
        "activations": p.activations,
        "cache_units": p.cache_units,
        "resident_units": list(resident),
        "streamed_units": list(streamed),
        "kept_tapes": p.kept,
        "lean_buffers": p.lean,
        "predicted_step_s": step_s,
    }
