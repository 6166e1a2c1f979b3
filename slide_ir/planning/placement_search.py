"""The placement search: the candidates of one configuration, each ledger and timing computed
once, and the order in which `slide_ir.planning.placement.choose_placement` visits them.

Each candidate that fits is built as a RANK_STEPS-step graph and timed by
`slide_ir.planning.timeline`, which is the simulator's prediction of that graph, op for op
(tests/simulator/test_timeline.py). Only free dimensions are searched: a count, place or depth
the user gave is kept.

1. Seeds, per activation placement: the rule before this search (no resident units; streamed
   units by the closed-form estimate of `streaming.choose_streamed`), and nothing on the GPU.
2. The resident count, per activation placement, by golden-section search over the counts
   that fit: the step is the longer of a bound that falls with the count (host updates, the
   link) and one that rises (device updates on the compute lane), one minimum. Then streamed
   units for the memory left, by the closed-form estimate. Under global clipping, where a
   streamed unit updates after the norm (`post_norm`), each resident count is also timed with
   its best streamed count, searched the same way (`resident_and_streamed`), from the fastest
   of each activation placement: with the inputs on the host the forward's saves queue on the
   `d2h` lane behind the states going down after the norm, so the inputs' home decides what
   streaming gains.
3. Other cache depths (DEPTHS) for the fastest, its resident count re-fitted to each; where
   nothing fits at the default depth, the search runs again with two cache units.
4. Kept tapes (`TrainConfig.keep_activations`: the top layers' forwards keep their autograd
   tapes, so they are not recomputed) for the fastest, by golden-section search over 0 to the
   most that fit with no resident units, each count with as many resident units as fit beside
   it: tapes and resident units compete for the same GPU memory, and less recompute leaves the
   host's updates the bottleneck, which more resident units relieve; along that frontier the
   step falls with the recompute saved and rises once resident units must go, one minimum.
   Skipped when one tape beside the fastest's own units does not shorten its step (the compute
   lane does not bound it; the fastest's resident count was not cut short by memory).
   Then fewer resident units beside the fastest's tapes, one at a time while faster (device
   updates run on the compute lane). With the chosen inputs and depth, this finds the best of
   every even count of tapes x every resident count that fits for llama-3.2-3b and -3.1-8b at
   batch 16 on the H200, and beats it by 0.9% on the RTX 4090 preset (an odd count).

Resident units are searched before streamed ones: a streamed unit's GPU staging (FP32 master,
moments and the update's FP32 gradient: 16 B/param with FP32 moments) costs what a resident
unit (BF16 weights and grads, FP32 master and moments) does, and a resident unit moves nothing
over the link. Under global clipping a streamed unit holds 4 B/param and its state passes
through a ring of slots after the norm (`post_norm`): fewer resident units leave room for
many, hence the paired search of step 2. On the catalog presets the search lands within 1.7%
of the best of every activation x depth x resident count (tests/slide_ir/test_placement.py
checks two of them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from slide_ir.ir.graph import Graph
from slide_ir.planning.cost import CostModel
from slide_ir.planning.integer_search import argmin_unimodal, last_true
from slide_ir.planning.ledger import Ledger, build_ledger, gpu_budget
from slide_ir.planning.placement_choice import Candidate, Placement
from slide_ir.planning.sharding import rank_bytes, rank_overflows, shard_graph
from slide_ir.planning.streaming import choose_streamed
from slide_ir.planning.timeline import predict_step_s
from slide_ir.planning.units import resident_preference, unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

RANK_STEPS = 3  # steps of a candidate's graph: the steady step (>= 2) is what is ranked
DEPTHS = (2, 3, 4, 6)  # cache depths searched, around DEFAULT_CACHE_UNITS
Build = Callable[[TrainConfig, Ledger], Graph]


def _pinned(config: TrainConfig, activations: str, resident: int, streamed: int) -> Placement:
    """`config`'s own values where given, the arguments for its "auto" counts (and no kept
    tapes for an "auto" count of them)."""
    return Placement(
        activations=activations,
        cache_units=config.cache_depth,
        resident=resident if config.resident == "auto" else int(config.resident),
        streamed=streamed if config.streamed == "auto" else int(config.streamed),
        kept=config.kept_tapes,
        lean=config.lean_buffers,
    )


def _check_counts(model: ModelSpec, config: TrainConfig) -> None:
    """Pinned counts within the model's units (the embedding, the decoder layers, the head)."""
    units = len(resident_preference(model))
    if isinstance(config.resident, int) and config.resident > units:
        raise ValueError(
            f"resident must be at most {units} for {model.name} (the embedding, "
            f"{model.num_layers} decoder layers, the head), got {config.resident}"
        )
    layers = model.num_layers
    if isinstance(config.keep_activations, int) and config.keep_activations > layers:
        raise ValueError(
            f"keep_activations must be at most {layers} (the decoder layers of {model.name}), "
            f"got {config.keep_activations}"
        )
    sliding = units - (config.resident if isinstance(config.resident, int) else 0)
    if isinstance(config.streamed, int) and config.streamed > sliding:
        raise ValueError(
            f"streamed must be at most {sliding} (the sliding units of {model.name}), "
            f"got {config.streamed}"
        )


class PlacementSearch:
    """The candidates of one configuration, each ledger and timing computed once. With `nproc`
    data-parallel ranks a candidate is what rank 0 (the largest shard) holds and runs: its
    pools sharded (resident units' FP32 state 1/N on each GPU; host state shared by the N
    ranks of the host), its graph with the collectives, its host work at 1/N of the host."""

    def __init__(
        self, model: ModelSpec, machine: Machine, config: TrainConfig, build: Build, nproc: int = 1
    ):
        self.model, self.machine, self.config, self.build = model, machine, config, build
        self.nproc = nproc
        self.budget = gpu_budget(machine, config)
        self.costs = CostModel(machine, cpu_threads=config.cpu_threads, nproc=nproc)
        self.timed: dict[Placement, Candidate] = {}
        self.ledgers: dict[Placement, Ledger] = {}
        # under global clipping a streamed unit updates after the norm (`post_norm`): one GPU's
        plain = (config.optimizer, config.grad_accum) == ("cpu", 1)
        if config.deferred_updates and nproc > 1:
            if isinstance(config.streamed, int) and config.streamed > 0:
                raise ValueError(
                    f"streamed={config.streamed} with clip 'global' runs on one GPU only (got "
                    f"{nproc} data-parallel ranks); use streamed=0 or 'auto', or clip 'per-unit'"
                )
            plain = False
        self.acts = ("cpu", "gpu") if config.activations == "auto" else (config.activations,)
        self.free_resident = config.resident == "auto"
        self.free_streamed = config.streamed == "auto" and plain
        self.free_depth = config.cache_units == "auto"
        # a tied head has no parameters of its own: nothing to stream
        self.units_with_params = {u for u in resident_preference(model) if unit_params(model, u)}
        self.free_tapes = config.keep_activations == "auto"
        self.free = (
            len(self.acts) > 1
            or self.free_resident
            or self.free_streamed
            or self.free_depth
            or self.free_tapes
        )
        _check_counts(model, config)

    def smallest(self) -> Placement:
        return _pinned(self.config, self.acts[0], 0, 0)

    # -- seeds and refinement --------------------------------------------------------------
    def seed(self) -> Placement:
        """Time the rule before the search and nothing on the GPU, per activation placement;
        return that rule's own choice (the inputs on the GPU when it streams and fits there)."""
        legacy = {acts: self.legacy(acts) for acts in self.acts}
        for acts, p in legacy.items():
            self.time(p)
            self.time(self.base(acts))
        on_gpu = legacy.get("gpu")
        if on_gpu is not None and on_gpu.streamed and self.fits(on_gpu):
            return on_gpu
        return legacy[self.acts[0]]

    def base(self, acts: str, depth: int | None = None) -> Placement:
        """Pinned counts, 0 for the free ones."""
        p = _pinned(self.config, acts, 0, 0)
        return p if depth is None else replace(p, cache_units=depth)

    def legacy(self, acts: str) -> Placement:
        """Today's rule: no resident units unless pinned, streamed ones by the estimate."""
        return self.with_estimated_streams(self.base(acts))

    def with_estimated_streams(self, p: Placement) -> Placement:
        if not self.free_streamed:
            return p
        resident, _ = p.units(self.model)
        config = replace(self.config_of(p), streamed="auto")
        streamed = choose_streamed(self.model, self.machine, config, resident)
        return replace(p, streamed=len(streamed))

    def refine(self, depth: int | None = None) -> None:
        """Per activation placement: the resident count by golden-section search, then
        streamed units for the memory left; then the cache depth of the fastest."""
        for acts in self.acts:
            best = self.best_resident(self.base(acts, depth))
            if best is not None:
                self.time(self.with_estimated_streams(best))
        if self.free_streamed and self.config.deferred_updates and not self.config.speculated:
            for acts in self.acts:  # the inputs' home too: the states' downloads delay saves
                self.resident_and_streamed(replace(self.fastest(acts=acts), kept=0))
        fastest = self.fastest()
        if self.free_depth and fastest.cache_units == self.config.cache_depth:
            self.refine_depth(fastest)

    def anything_fits(self) -> bool:
        """Whether the search would find a placement that fits (ledgers only, no timing)."""
        depths = {self.config.cache_depth, 2} if self.free_depth else {self.config.cache_depth}
        if any(self.fits(p) for p in (*self.floors(), *map(self.legacy, self.acts))):
            return True
        if not self.free_resident:
            return any(self.fits(self.base(a, d)) for a in self.acts for d in depths)
        return any(self.resident_counts(self.base(a, d)) for a in self.acts for d in depths)

    def best_resident(self, base: Placement) -> Placement | None:
        """The resident count, other choices as in `base`, with the shortest step."""
        if not self.free_resident:
            return base if self.fits(base) else None
        counts = self.resident_counts(base)
        if not counts:
            return None
        i = argmin_unimodal(
            lambda i: self.time(replace(base, resident=counts[i])).step_s, 0, len(counts) - 1
        )
        return replace(base, resident=counts[i])

    def resident_and_streamed(self, base: Placement) -> None:
        """Global clipping, its updates deferred (a streamed unit never speculates: the
        speculating search leaves streaming to this one), from the fastest so far (`base`):
        the resident count up to its own by golden-section search, each count timed with its
        best streamed count (the same search inside). A streamed unit holds 4 B/param of GPU
        memory where a resident one holds 16, so the best pair has fewer resident units than
        the best count alone; both steps have one minimum (the host's updates after the norm
        against the link's and the compute lane's)."""

        def streamed_step(resident: int) -> float:
            p = replace(base, resident=resident)
            most = sum(1 for u in resident_preference(self.model)[resident:]
                       if u in self.units_with_params)  # fmt: skip
            top = last_true(lambda k: self.gpu_fits(replace(p, streamed=k)), 0, most) or 0
            k = argmin_unimodal(lambda k: self.time(replace(p, streamed=k)).step_s, 0, top)
            return self.time(replace(p, streamed=k)).step_s

        if not self.fits(base) or base.resident + base.streamed >= len(self.units_with_params):
            return  # every unit already updates on the GPU: nothing waits for the host
        counts = [r for r in self.resident_counts(base) if r <= base.resident]
        if not self.free_resident:
            counts = [base.resident]
        if counts:
            argmin_unimodal(lambda i: streamed_step(counts[i]), 0, len(counts) - 1)

    def refine_depth(self, best: Placement) -> None:
        """Other depths for the fastest placement, its resident count clipped to what fits
        there (the most that fit, if it had the most at its own depth)."""
        resident, _ = best.units(self.model)
        if all(u in resident for u in range(1, self.model.num_layers + 1)):
            return  # nothing slides: no cache units
        own = self.resident_counts(best) if self.free_resident else []
        for depth in DEPTHS:
            p = replace(best, cache_units=depth)
            counts = self.resident_counts(p) if self.free_resident else []
            if counts:
                most = bool(own) and best.resident == own[-1]
                near = min(counts, key=lambda r: (abs(r - best.resident), r))
                p = replace(p, resident=counts[-1] if most else near)
            self.time(p)

    def refine_tapes(self, start: Placement | None = None, *, unstreamed: bool = False) -> None:
        """Kept tapes for the fastest placement (step 4 of the module docstring), or for `start`
        at its own resident units; `unstreamed`: for the fastest that streams nothing (under
        global clipping, the search's result without streamed units is never beaten)."""
        if not self.free_tapes or not self.timed:
            return
        best = start or self.fastest(unstreamed=unstreamed)
        if not self.fits(best):
            return
        most = last_true(lambda k: self.gpu_fits(self.with_tapes(best, k, 0)), 0,
                          self.model.num_layers)  # fmt: skip
        one = self.with_tapes(best, 1, best.resident)
        if not most or (one.resident == best.resident and not self.faster(one, best)):
            return  # the compute lane does not bound the step: less recompute cannot help
        units = len(resident_preference(self.model)) - best.streamed
        frontier = units if self.free_resident and start is None else best.resident
        argmin_unimodal(lambda k: self.time(self.with_tapes(best, k, frontier)).step_s, 0, most)
        p = self.fastest(unstreamed=unstreamed)
        while p.kept and self.free_resident and p.resident > 0:
            fewer = replace(p, resident=p.resident - 1)
            if not self.faster(fewer, p):
                break
            p = fewer

    def faster(self, p: Placement, than: Placement) -> bool:
        return self.time(p).rank() < self.time(than).rank()

    def with_tapes(self, p: Placement, kept: int, resident: int) -> Placement:
        """`p` with `kept` tapes and `resident` units, fewer where fewer fit beside the tapes."""
        p = replace(p, kept=kept, resident=resident if self.free_resident else p.resident)
        if not self.free_resident or self.gpu_fits(p):
            return p
        top = last_true(lambda r: self.gpu_fits(replace(p, resident=r)), 0, resident)
        return replace(p, resident=top or 0)

    def fastest(self, *, unstreamed: bool = False, acts: str | None = None) -> Placement:
        """The fastest timed candidate (one that does not fit when none does); `unstreamed`:
        of those that stream nothing, `acts`: of those with the inputs there, where there are
        any."""
        timed = [c for c in self.timed.values()
                 if not (unstreamed and c.placement.streamed)
                 and acts in (None, c.placement.activations)]  # fmt: skip
        return min(timed or self.timed.values(), key=Candidate.rank).placement

    # -- what fits --------------------------------------------------------------------------
    def resident_counts(self, p: Placement) -> list[int]:
        """The resident counts that fit with `p`'s other choices, in order. The GPU ledger grows
        with the count (bisected); the host's mostly shrinks, but not always (the first unit
        on the GPU gives every host-updated layer a landing buffer), so each is checked."""
        most = len(resident_preference(self.model)) - p.streamed
        top = last_true(lambda r: self.gpu_fits(replace(p, resident=r)), 0, most)
        if top is None:
            return []
        return [r for r in range(top + 1) if self.feasible(replace(p, resident=r))]

    def gpu_fits(self, p: Placement) -> bool:
        return self.gpu_bytes(p) <= self.budget

    def gpu_bytes(self, p: Placement) -> int:
        """What `p` holds on (each rank's) GPU."""
        if self.nproc == 1:
            return self.ledger(p).peak_bytes("gpu")
        return rank_bytes(self.ledger(p), self.model, self.nproc)["gpu"]

    def feasible(self, p: Placement) -> bool:
        """Every tier fits: a GPU per rank, the host's RAM and drives for all ranks."""
        if self.nproc == 1:
            return self.ledger(p).feasible
        return not rank_overflows(self.ledger(p), self.model, self.nproc)

    def fits(self, p: Placement) -> bool:
        """Every tier fits; the GPU also under the budget, unless `p` is the smallest placement
        (at the default depth, or with two cache units when the depth is free): nothing chosen
        adds to the GPU, so it is judged like a pinned plan, as before this search."""
        return self.feasible(p) and (p in self.floors() or self.gpu_fits(p))

    def leanest(self) -> Placement:
        """The smallest placement with the host's copy buffers one deep: the planner's last
        resort where the smallest does not fit (`TrainConfig.lean_buffers`)."""
        return replace(self.smallest(), lean=True)

    def fallback(self) -> Placement:
        """The smallest placement, or the leanest where only that fits."""
        small, lean = self.smallest(), self.leanest()
        return lean if not self.feasible(small) and self.feasible(lean) else small

    def floors(self) -> set[Placement]:
        """The smallest placement, with two cache units too when the depth is free, each with
        the copy buffers as asked and one deep (the GPU holds the same either way)."""
        small = self.smallest()
        depths = {small, replace(small, cache_units=2)} if self.free_depth else {small}
        return {replace(p, lean=lean) for p in depths for lean in (False, True)}

    def config_of(self, p: Placement) -> TrainConfig:
        return replace(
            self.config,
            activations=p.activations,
            cache_units=p.cache_units,
            resident=p.resident,
            streamed=p.streamed,
            keep_activations=p.kept,
            lean_buffers=p.lean,
            steps=RANK_STEPS,
        )

    def ledger(self, p: Placement) -> Ledger:
        if p not in self.ledgers:
            resident, streamed = p.units(self.model)
            self.ledgers[p] = build_ledger(
                self.model, self.machine, self.config_of(p), resident, streamed
            )
        return self.ledgers[p]

    def time(self, p: Placement) -> Candidate:
        """`p`'s predicted steady step (inf, untimed, when it does not fit)."""
        if p not in self.timed:
            ledger = self.ledger(p)
            step_s = math.inf
            if self.fits(p):
                graph = self.build(self.config_of(p), ledger)
                graph = shard_graph(graph, self.model, self.nproc, 0, check=False)
                step_s = predict_step_s(graph, self.costs)
            self.timed[p] = Candidate(placement=p, step_s=step_s, gpu_bytes=self.gpu_bytes(p))
        return self.timed[p]
