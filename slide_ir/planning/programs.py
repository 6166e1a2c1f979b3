"""A Plan lowered to the Program an interpreter runs: the pass graphs a run needs, sharded for
its rank, with the facts of the plan the executor reports or checks.

A run of any length repeats a graph of at most `GRAPH_STEPS` steps: planning a 100,000-step
run costs what planning 64 steps does, and the ops, completions and events alive at any time do
not grow with the run. The executor runs passes of `next_pass` steps between the stops the
controller asks for (the end, and the step after which it checks its placement), so
`pass_lengths` names every graph those passes need and `program` plans each one once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from slide_ir.ir.graph import Graph
from slide_ir.planning.data_parallel import shard_plan
from slide_ir.planning.ledger import REPORT_TIERS
from slide_ir.planning.planner import Plan, build_graph, plan, steady_step_s
from slide_ir.program import MAX_PASS_STEPS, Program, next_pass
from slide_ir.specs.config import TrainConfig

# steps of the graph a run repeats (tests shorten it): the first step of each repetition
# starts on a drained pipeline (on the H200, 3B at batch 16, it took 0.16 s more than the
# others, at 16-step repetitions: ~1% of the run); planning 64 steps of a 70B model takes 0.45 s
GRAPH_STEPS = MAX_PASS_STEPS


def graph_config(config: TrainConfig) -> TrainConfig:
    """The configuration of the graph a run of `config.steps` steps repeats."""
    return replace(config, steps=min(config.steps, GRAPH_STEPS))


def pass_lengths(graph_steps: int, stops: Iterable[int], done: int = 0) -> list[int]:
    """The lengths of the passes a run that has done `done` steps takes to reach each of
    `stops` (steps done, ascending) in turn, each once, in the order first taken."""
    lengths = dict[int, None]()
    for stop in stops:
        while done < stop:
            lengths[n := next_pass(graph_steps, done, stop)] = None
            done += n
    return list(lengths)


def pass_plan(p: Plan, steps: int) -> Plan:
    """`p` re-planned for a pass of `steps` steps (itself when it is one): the same choices,
    the same pools."""
    if p.config.steps == steps:
        return p
    out = plan(p.model, p.machine, replace(p.config, steps=steps))
    assert out.graph.pools == p.graph.pools, "a plan's pools must not depend on its steps"
    return out


def eval_graph(p: Plan, batches: int) -> Graph:
    """The forward-only graph of `batches` eval batches on `p`'s pools and placement
    (`slide_ir.planning.evaluation`)."""
    config = replace(p.config, steps=batches, grad_accum=1)
    return build_graph(p.model, p.machine, config, p.ledger, forward_only=True)


def program(
    p: Plan,
    stops: Iterable[int],
    *,
    done: int = 0,
    cpu_threads: int | None,
    nproc: int = 1,
    rank: int = 0,
    predicted: bool = True,
    eval_batches: int = 0,
) -> Program:
    """The Program of plan `p` (one rank's single-GPU plan at the rank's batch, when `nproc` >
    1) for a run that, `done` steps in, stops after each of `stops` steps; `predicted=False` leaves the plan's
    predicted step out of what is reported (a CPU-mode run is not the machine it was planned
    for). The whole graph is in it even when no pass runs it whole: the run's steps and its
    trace are numbered in it. `eval_batches` > 0: with the eval passes over that many batches
    (single-process runs only)."""
    if eval_batches and nproc > 1:
        raise ValueError("eval graphs are planned for one process: data-parallel ranks have none")
    graph_steps = min(p.config.steps, GRAPH_STEPS)
    passes = {}
    for n in dict.fromkeys([graph_steps, *pass_lengths(graph_steps, stops, done)]):
        q = pass_plan(p, n)
        passes[n] = q.graph if nproc == 1 else shard_plan(q, nproc, rank).graph
    evaluation = {n: eval_graph(p, n) for n in pass_lengths(GRAPH_STEPS, [eval_batches])}
    gpu = p.ledger.peak_bytes("gpu") if nproc == 1 else shard_plan(p, nproc, rank).rank_bytes("gpu")
    return Program(
        model=p.model,
        passes=passes,
        evaluation=evaluation,
        cpu_threads=cpu_threads,
        drives=len(p.machine.nvme),
        gpu_bytes=gpu,
        machine=p.machine.name,
        placement=_placement(p, predicted, nproc) if p.choice is not None else {},
    )


def _placement(p: Plan, predicted: bool, nproc: int) -> dict[str, Any]:
    """What the placement search chose and the step predicted for it (on the profile it
    planned with: after a re-plan, the re-fit one), so a run can be set against its plan;
    with speculated updates, the kept and the rolled-back step (`Speculation.summary`); and the
    ledger's peak per tier, which a single-process run sets its measured memory against (ranks
    share one host's RAM, so theirs is not one rank's ledger)."""
    assert p.choice is not None
    chosen = p.choice.chosen
    # the search's figure, with speculation the expected step, and for a placement no search
    # timed (`--placement small`, every count pinned) its own graph's
    step = steady_step_s(p, nproc) if predicted and p.feasible else None
    out: dict[str, Any] = {"chosen": chosen.describe(p.model), "how": p.choice.how,
           "predicted_step_s": step,
           "tokens_per_step": p.graph.info.tokens_per_step}  # fmt: skip
    if predicted and nproc == 1:
        out["planned_bytes"] = {tier: p.ledger.peak_bytes(tier) for tier in REPORT_TIERS}
    if p.speculation is not None:  # the step depends on how many steps roll back
        out["speculation"] = p.speculation.summary()
    return out
