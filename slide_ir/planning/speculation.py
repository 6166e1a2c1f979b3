"""How many host-updated units speculate under global clipping.

Deferral (`deferral`) keeps global clipping exact by holding every update until the step's norm
is known, so the host's updates overlap the next forward instead of the backward: on a host
that bounds the step (a 24 GB-class GPU, everything sliding) that is a third to a half more
step time. A speculated unit updates as its gradient lands, as without clipping, and saves its
old master and moments into a rollback slot on the way (`state_terms.rollback_terms`: 12 B/param
more RAM with FP32 moments, and 12 B/param more written by the update); its `REDO` after the
norm restores and redoes it in the step that must clip (or restores it in one that is skipped).

The units speculated are the first to land (the head, then the top layers): their updates fill
the backward's idle host time, and every one taken off the queue after the norm lets the next
forward start sooner. Speculating every unit is not always fastest: where the host bounds the
step, the saved state makes each speculated update slower. So the count is searched: each
count's graph timed twice, as a step that keeps its speculation and as one that rolls back,
and the count with the least expected step at `TrainConfig.rollback_share` wins, among those
whose ledger fits (the rollback slots are RAM).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slide_ir.planning.cost import CostModel
from slide_ir.planning.integer_search import argmin_unimodal, last_true
from slide_ir.planning.ledger import Ledger, build_ledger
from slide_ir.planning.placement_search import RANK_STEPS, Build
from slide_ir.planning.sharding import shard_graph
from slide_ir.planning.state_terms import speculated_units
from slide_ir.planning.timeline import predict_step_s
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Speculation:
    """The speculated count chosen and its predicted steps."""

    units: int  # host-updated units that speculate (0: every update is deferred)
    step_s: float  # a step that keeps its speculative updates
    rollback_step_s: float  # a step that rolls them back (clipped or not finite)
    deferred_step_s: float  # with nothing speculated
    rollback_share: float  # the share of rolled-back steps the choice expects

    @property
    def expected_step_s(self) -> float:
        return expected(self.step_s, self.rollback_step_s, self.rollback_share)

    def summary(self) -> dict[str, object]:
        return {
            "speculated_units": self.units,
            "step_s": self.step_s,
            "rollback_step_s": self.rollback_step_s,
            "deferred_step_s": self.deferred_step_s,
            "rollback_share": self.rollback_share,
            "expected_step_s": self.expected_step_s,
        }


def expected(step_s: float, rollback_step_s: float, share: float) -> float:
    return (1.0 - share) * step_s + share * rollback_step_s


def can_speculate(config: TrainConfig) -> bool:
    """Global clipping of the sliding schedule with the host's state in RAM."""
    # a speculated unit's gradient stays in its landing slot until the norm: none go to a drive
    return (config.deferred_updates and config.schedule == "sliding" and config.optimizer == "cpu"
            and not config.spills_grads)  # fmt: skip


def choose_speculation(
    model: ModelSpec,
    machine: Machine,
    config: TrainConfig,
    resident: tuple[int, ...],
    streamed: tuple[int, ...],
    build: Build,
    *,
    nproc: int = 1,
) -> Speculation | None:
    """The count of `config` (its placement resolved): the one asked for, or for "auto" the
    least expected step that fits; None where nothing can speculate."""
    if not can_speculate(config):
        return None
    ask = replace(config, speculate=model.num_layers + 2)
    host = [u for u in range(model.num_layers + 2) if u not in resident and u not in streamed]
    most = len(speculated_units(model, ask, host))
    costs = CostModel(machine, cpu_threads=config.cpu_threads, nproc=nproc)
    timed: dict[int, tuple[float, float]] = {}

    def ledger(k: int) -> Ledger:
        return build_ledger(model, machine, replace(config, speculate=k), resident, streamed)

    def time(k: int) -> tuple[float, float]:
        if k not in timed:
            c = replace(config, speculate=k, steps=RANK_STEPS)
            graph = shard_graph(build(c, ledger(k)), model, nproc, 0, check=False)
            timed[k] = (predict_step_s(graph, costs), predict_step_s(graph, costs.rolling_back()))
        return timed[k]

    def cost(k: int) -> float:
        return expected(*time(k), config.rollback_share)

    if config.speculate != "auto":
        k = min(int(config.speculate), most)
    else:
        fits = last_true(lambda k: ledger(k).feasible, 0, most)
        k = 0 if fits is None else argmin_unimodal(cost, 0, fits)
        k = k if cost(k) < cost(0) else 0
    step_s, rollback_s = time(k)
    return Speculation(units=k, step_s=step_s, rollback_step_s=rollback_s,
                       deferred_step_s=time(0)[0], rollback_share=config.rollback_share)  # fmt: skip
