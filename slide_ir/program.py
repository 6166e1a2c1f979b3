"""The Program: what the planner hands an interpreter, and all an interpreter may know of a run.

A run repeats a graph of a few steps (a 100,000-step run is planned as 64 steps), and a run whose
steps the graph does not divide ends on a shorter pass: the Program holds a graph per pass
length it will run (`passes`). Beside the graphs it carries the few facts of the machine and the
plan that the graphs do not say and the executor needs: the CPU lane's thread count, the NVMe
drives the `nvme*` lanes stripe over, the GPU bytes the ledger planned (checked against the
real device before anything is allocated) and what the placement search chose (reported beside
the measured step). The executor runs it without a Plan, a TrainConfig or a Machine: every
decision was made before it, in the planner and the controller (`slide.session`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slide_ir.ir.graph import Graph, GraphInfo, load_versioned
from slide_ir.specs.model import ModelSpec

FORMAT_VERSION = 1
# the longest pass a Program holds (a longer run repeats it); a graph's per-step pools (the
# step losses) have this many slots
MAX_PASS_STEPS = 64


class ProgramError(ValueError):
    pass


def next_pass(graph_steps: int, done: int, stop: int) -> int:
    """Steps of the pass that starts after `done` steps on the way to `stop`: the whole graph,
    or what is left when less is (the planner plans a graph for every pass this gives)."""
    return min(graph_steps, stop - done)


@dataclass(frozen=True, kw_only=True)
class Program:
    model: ModelSpec
    passes: Mapping[int, Graph]  # pass length (steps) -> its graph; the longest repeats
    cpu_threads: int | None  # the CPU lane's intra-op threads (None: leave torch's setting)
    drives: int  # NVMe drives the graph's nvme lanes and state stripes run on
    gpu_bytes: int  # the ledger's GPU peak for this rank
    machine: str  # the machine profile's name, for messages
    placement: Mapping[str, Any] = field(default_factory=dict)  # the search's choice, reported
    # eval pass length (batches) -> its forward-only graph (`slide_ir.planning.evaluation`),
    # run between training passes; empty: the run evaluates nothing
    evaluation: Mapping[int, Graph] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.passes:
            raise ProgramError("a Program needs at least one pass graph")
        for steps, graph in self.passes.items():
            if graph.info.steps != steps:
                raise ProgramError(f"pass {steps}'s graph covers {graph.info.steps} steps")
        pools = {g.pools for g in (*self.passes.values(), *self.evaluation.values())}
        if len(pools) > 1:
            raise ProgramError("every pass of a Program (eval passes too) must have the same pools")
        for batches, graph in self.evaluation.items():
            if graph.info.steps != batches or graph.info.grad_accum != 1:
                raise ProgramError(f"eval pass {batches}'s graph must cover {batches} batches "
                                   "of one micro-batch each")  # fmt: skip

    @property
    def graph(self) -> Graph:
        """The repeated step graph: the longest pass."""
        return self.passes[max(self.passes)]

    @property
    def info(self) -> GraphInfo:
        return self.graph.info

    def eval_pass(self, done: int, stop: int) -> int:
        """Batches of the eval pass that starts after `done` of `stop` eval batches."""
        return next_pass(max(self.evaluation), done, stop)

    def pass_graph(self, steps: int) -> Graph:
        try:
            return self.passes[steps]
        except KeyError:
            raise ProgramError(
                f"no {steps}-step pass in this Program (it has {sorted(self.passes)})"
            ) from None

    # -- serial form ---------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "version": FORMAT_VERSION,
                "model": {"name": self.model.name, "config": self.model.to_hf_config()},
                "passes": {str(n): json.loads(g.to_json()) for n, g in sorted(self.passes.items())},
                "cpu_threads": self.cpu_threads,
                "drives": self.drives,
                "gpu_bytes": self.gpu_bytes,
                "machine": self.machine,
                "placement": dict(self.placement),
                "evaluation": {
                    str(n): json.loads(g.to_json()) for n, g in sorted(self.evaluation.items())
                },
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Program:
        data = load_versioned(text, FORMAT_VERSION, "program", ProgramError)
        model = data["model"]
        return cls(
            model=ModelSpec.from_hf_config(model["config"], name=model["name"]),
            passes={int(n): Graph.from_json(json.dumps(g)) for n, g in data["passes"].items()},
            cpu_threads=data["cpu_threads"],
            drives=data["drives"],
            gpu_bytes=data["gpu_bytes"],
            machine=data["machine"],
            placement=data["placement"],
            evaluation={
                int(n): Graph.from_json(json.dumps(g)) for n, g in data["evaluation"].items()
            },
        )
