"""The default placement: resident, streamed and sliding units, where the layer inputs live and
the cache depth, chosen together as the fastest predicted plan that fits.

A `Placement` (`slide_ir.planning.placement_choice`) names counts: the first `resident` units
of `resident_preference` live whole on the GPU, the next `streamed` are updated there with
their FP32 state streamed over the link, the rest slide (updated by the host). A candidate fits
when every tier does and its GPU ledger stays under `ledger.gpu_budget` ((1 - gpu_margin) of
the GPU, capped by `gpu_memory_gb`); the smallest placement (`PlacementSearch.floors`) needs only to fit, as a
pinned plan does. The fastest predicted steady step that fits wins, equal steps to the smaller
GPU footprint; `slide_ir.planning.placement_search` says which candidates are timed, in what
order, and why.

Here are the planner's entry points: `choose_placement` for a plan, and `plan_fits` and
`smallest_ledger`, which answer from ledgers alone (no graph is built or timed) for the
bisections over batch or model size.
"""

from __future__ import annotations

from dataclasses import replace

from slide_ir.ir.graph import Graph
from slide_ir.planning.ledger import Ledger, build_ledger
from slide_ir.planning.placement_choice import Candidate, Placement, PlacementChoice
from slide_ir.planning.placement_search import Build, PlacementSearch
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec


def choose_placement(
    model: ModelSpec, machine: Machine, config: TrainConfig, build: Build, *, nproc: int = 1
) -> PlacementChoice:
    """The placement of `config`: its pinned values, and the fastest predicted choice of the
    rest (`placement="fast"`) or the smallest footprint (`"small"`). `nproc` > 1: for one rank
    of data-parallel sliding, each candidate sized and timed sharded (see `PlacementSearch`)."""
    if config.schedule != "sliding":  # nothing slides: no units to place, no cache ring
        acts = "cpu" if config.activations == "auto" else config.activations
        chosen = Placement(activations=acts, cache_units=config.cache_depth, resident=0, streamed=0)
        if config.kept_tapes:
            raise ValueError(
                f"keep_activations={config.kept_tapes} needs schedule 'sliding' "
                f"(got '{config.schedule}'); use 0 or 'auto'"
            )
        return PlacementChoice(chosen=chosen, how="schedule")
    search = PlacementSearch(model, machine, config, build, nproc)
    if config.placement == "small" or not search.free:
        how = "small" if config.placement == "small" and search.free else "pinned"
        return PlacementChoice(chosen=search.fallback(), how=how)
    legacy = search.seed()
    search.refine()
    if search.free_depth and not any(c.fits for c in search.timed.values()):
        search.refine(depth=2)  # the smallest ring, for a GPU that is short of one unit
        for floor in search.floors():
            search.time(floor)
    search.refine_tapes()
    if config.deferred_updates:  # the search without streamed units, with its tapes: never beaten
        search.refine_tapes(unstreamed=True)
    search.refine_tapes(legacy)  # the rule before the search, with its tapes: never beaten
    timed = sorted(search.timed.values(), key=Candidate.rank)
    fitting = tuple(c for c in timed if c.fits)
    if not fitting and search.feasible(search.leanest()):
        fitting = (search.time(search.leanest()),)  # the copy buffers one deep: it fits
    if not fitting:
        return PlacementChoice(chosen=search.smallest(), how="nothing fits", legacy=legacy)
    chosen = fitting[0].placement
    return PlacementChoice(chosen=chosen, how="searched", considered=fitting, legacy=legacy,
                           ledger=search.ledger(chosen),
                           timed_speculated=config.speculated)  # fmt: skip


def plan_fits(model: ModelSpec, machine: Machine, config: TrainConfig) -> bool:
    """Whether `slide_ir.planning.planner.plan` of `config` fits: some placement its search would
    consider fits every tier (ledgers only: for bisections over batch or model size)."""
    config = _smallest_held(machine, config)
    if config.schedule != "sliding":
        return smallest_ledger(model, machine, config).feasible
    search = PlacementSearch(model, machine, config, _no_build)
    if config.placement == "small" or not search.free:
        return search.feasible(search.fallback())
    return search.anything_fits()


def smallest_ledger(model: ModelSpec, machine: Machine, config: TrainConfig) -> Ledger:
    """The ledger of the smallest footprint the planner would consider (`--placement small`
    where the counts are free, its copy buffers one deep; a baseline schedule's own): what
    decides whether a model fits."""
    config = _smallest_held(machine, config)
    if config.schedule != "sliding":
        acts = "cpu" if config.activations == "auto" else config.activations
        return build_ledger(model, machine, replace(config, activations=acts))
    search = PlacementSearch(model, machine, config, _no_build)
    return search.ledger(search.leanest())


def _smallest_held(machine: Machine, config: TrainConfig) -> TrainConfig:
    """An unresolved `held_grads` at its smaller footprint: on a drive, where there is one."""
    if config.held_grads == "auto" and config.may_spill_grads and machine.nvme:
        return replace(config, held_grads="nvme")
    return config


def _no_build(config: TrainConfig, ledger: Ledger) -> Graph:
    raise AssertionError("plan_fits builds no graph")
