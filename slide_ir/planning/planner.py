"""The planner: (ModelSpec, Machine, TrainConfig) -> Plan = memory ledger + schedule Graph.

The placement is decided first (`slide_ir.planning.placement`: which units stay resident, which are
streamed, where the layer inputs live, the cache depth: the fastest predicted choice that fits),
then the ledger (what every tier holds), whose terms become the Graph's pools, and a schedule
emitter writes the ops. An infeasible plan is still built (so a user can see it) but reports its
overflow; engines refuse to run it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any, TypeVar

from slide_ir.ir.graph import Graph, GraphInfo, UnitPlacement
from slide_ir.planning.baselines import emit_gpu_only, emit_zero_offload
from slide_ir.planning.builder import GraphBuilder
from slide_ir.planning.compute_terms import lce_chunk_tokens
from slide_ir.planning.cost import CostModel
from slide_ir.planning.emit_context import Ctx
from slide_ir.planning.evaluation import emit_eval, eval_flops_per_batch
from slide_ir.planning.ledger import Ledger, build_ledger
from slide_ir.planning.placement import choose_placement
from slide_ir.planning.placement_choice import PlacementChoice
from slide_ir.planning.placement_search import RANK_STEPS
from slide_ir.planning.sharding import shard_graph
from slide_ir.planning.sliding import emit_sliding
from slide_ir.planning.speculation import Speculation, can_speculate, choose_speculation
from slide_ir.planning.streaming import state_pace
from slide_ir.planning.timeline import predict_step_s
from slide_ir.planning.units import resident_preference
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine, load_machine_toml, machine_to_toml
from slide_ir.specs.model import ModelSpec

PLAN_VERSION = 1
T = TypeVar("T")
EMITTERS = {"sliding": emit_sliding, "zero-offload": emit_zero_offload, "gpu-only": emit_gpu_only}


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    model: ModelSpec
    machine: Machine
    config: TrainConfig  # every "auto" resolved: re-planning it gives this plan
    ledger: Ledger
    graph: Graph
    choice: PlacementChoice | None = None  # how the placement was chosen, with the runner-up
    # global clipping: how many updates speculate, with the predicted steps that chose it
    speculation: Speculation | None = None

    @property
    def feasible(self) -> bool:
        return self.ledger.feasible


def plan(model: ModelSpec, machine: Machine, config: TrainConfig, *, nproc: int = 1) -> Plan:
    """The plan of `config`, with its "auto" choices made by `choose_placement`: the returned
    `Plan.config` holds them (activations, cache depth, resident and streamed counts; the
    host weights' layout, see `_host_weights`).
    `nproc` > 1: one rank's plan of data-parallel sliding (`data_parallel.shard_plan` shards
    it), its placement sized and timed as the ranks will run it; its own ledger is a single
    GPU's and may not fit one (the sharded one must)."""
    if (
        config.held_grads == "auto"
        and config.may_spill_grads
        and (config.optimizer != "cpu" or machine.nvme)
    ):
        return _held_grads(model, machine, config, nproc)
    return _weights_placed(model, machine, config, nproc)


def _weights_placed(model: ModelSpec, machine: Machine, config: TrainConfig, nproc: int) -> Plan:
    if config.host_weights == "auto" and config.schedule == "sliding":
        return _host_weights(model, machine, config, nproc)
    return _placed(model, machine, config, nproc)


def _held_grads(model: ModelSpec, machine: Machine, config: TrainConfig, nproc: int) -> Plan:
    """`held_grads="auto"`: the faster of the plans holding global clipping's gradients in RAM
    and on the drives that fits, RAM on a tie (when neither fits: the drives', the smaller
    footprint). On the drives they cost drive time, which the prediction sees where the
    drives bound the step."""
    plans = [_weights_placed(model, machine, replace(config, held_grads=h), nproc)
             for h in ("ram", "nvme")]  # fmt: skip
    fitting = [p for p in plans if p.feasible] or plans[1:]
    return min(fitting, key=lambda p: steady_step_s(p, nproc))


def _host_weights(model: ModelSpec, machine: Machine, config: TrainConfig, nproc: int) -> Plan:
    """`host_weights="auto"`: the faster of the cast and pinned plans that fit, cast on a tie
    (and when neither fits: the smaller footprint). Casting costs host work (every upload
    reads the FP32 master), which the prediction sees where the `cpu` lane bounds the step."""
    plans = [_placed(model, machine, replace(config, host_weights=h), nproc)
             for h in ("cast", "pinned")]  # fmt: skip
    fitting = [p for p in plans if p.feasible] or plans[:1]
    return min(fitting, key=lambda p: steady_step_s(p, nproc))


def steady_step_s(p: Plan, nproc: int) -> float:
    """The plan's predicted steady step: the placement search's, else its graph timed over
    `RANK_STEPS` steps as the search times a candidate."""
    if p.speculation is not None:
        return p.speculation.expected_step_s
    if p.choice is not None and p.choice.predicted_step_s is not None:
        return p.choice.predicted_step_s
    config = replace(p.config, steps=RANK_STEPS)
    graph = build_graph(p.model, p.machine, config, p.ledger, check=False, values=nproc > 1)
    graph = shard_graph(graph, p.model, nproc, 0, check=False)
    return predict_step_s(graph, CostModel(p.machine, cpu_threads=config.cpu_threads, nproc=nproc))


def _placed(model: ModelSpec, machine: Machine, config: TrainConfig, nproc: int) -> Plan:
    """`plan` with the host weights' layout given. Global clipping with its speculation free:
    the placement searched as deferral (nothing speculated) and as speculation (every host
    update speculated, then the count searched for that placement), the plan of the least
    expected step kept: speculation favours more host-updated units than deferral does."""
    if not (config.speculate == "auto" and can_speculate(config)):
        return _searched(model, machine, config, nproc)
    every = replace(config, speculate=model.num_layers + 2)
    tries = [_searched(model, machine, replace(config, speculate=0), nproc),
             _searched(model, machine, every, nproc, speculate=config.speculate)]  # fmt: skip
    return min(tries, key=lambda p: steady_step_s(p, nproc))


def _searched(
    model: ModelSpec, machine: Machine, config: TrainConfig, nproc: int, *,
    speculate: int | str | None = None,
) -> Plan:  # fmt: skip
    """The placement searched for `config`, then its speculated count chosen (`speculate`:
    the count to choose the placement's own by, where it differs from the search's)."""
    # the search's candidates are only timed: built unchecked (the plan's own graph is checked),
    # with the values their ops read and write only where sharding rewrites by them
    candidates = partial(build_graph, model, machine, check=False, values=nproc > 1)
    choice = choose_placement(model, machine, config, candidates, nproc=nproc)
    searched_with = config.speculated  # the count the search's ledgers hold slots for
    config = choice.resolve(config)
    resident, streamed = choice.chosen.units(model) if config.schedule == "sliding" else ((), ())
    if speculate is not None:
        config = replace(config, speculate=speculate)
    speculation = choose_speculation(model, machine, config, resident, streamed, candidates,
                                     nproc=nproc)  # fmt: skip
    config = replace(config, speculate=speculation.units if speculation else 0)
    # the search's own ledger of its choice, where it holds the chosen count's rollback slots
    # (a ledger does not depend on the steps planned)
    reuse = choice.ledger if config.speculated == searched_with else None
    ledger = reuse or build_ledger(model, machine, config, resident, streamed)
    graph = build_graph(model, machine, config, ledger)
    return Plan(model=model, machine=machine, config=config, ledger=ledger, graph=graph,
                choice=choice, speculation=speculation)  # fmt: skip


def build_graph(
    model: ModelSpec,
    machine: Machine,
    config: TrainConfig,
    ledger: Ledger,
    *,
    check: bool = True,
    values: bool | None = None,
    forward_only: bool = False,
) -> Graph:
    """The schedule of `config.schedule` over the ledger's pools and placement (`check=False`:
    without the graph's construction checks, and without the values ops read and write unless
    `values`); `forward_only`: its eval graph instead, `config.steps` eval batches
    (`evaluation`)."""
    ctx = Ctx(
        model=model,
        config=config,
        b=GraphBuilder(ledger.pools()),
        drives=len(machine.nvme),
        resident=frozenset(ledger.resident) if config.schedule == "sliding" else frozenset(),
        streamed=frozenset(ledger.streamed),
        pace=state_pace(model, machine, config),
        values=check if values is None else values,
        forward_only=forward_only,
    )
    (emit_eval if forward_only else EMITTERS[config.schedule])(ctx)
    flops = eval_flops_per_batch if forward_only else model_flops_per_step
    info = GraphInfo(
        schedule=config.schedule,
        model=model.name,
        machine=machine.name,
        batch=config.batch,
        seq=config.seq,
        steps=config.steps,
        grad_accum=config.grad_accum,
        num_layers=model.num_layers,
        params=model.total_params,
        flops_per_step=flops(model, config),
        placement=unit_placement(model, config, ledger),
        lce_chunk=lce_chunk_tokens(model, config),
        optimizer=str(config.optimizer),
        moments_dtype=str(config.moments_dtype),
        clip_norm=config.clip_norm if config.clip == "per-unit" else 0.0,
        global_clip_norm=config.clip_norm if config.deferred_updates else 0.0,
    )
    return ctx.b.build(info, check=check)


def unit_placement(
    model: ModelSpec, config: TrainConfig, ledger: Ledger
) -> tuple[UnitPlacement, ...]:
    """Where each unit 0..n+1 lives and who updates it."""
    P = UnitPlacement
    host = P.NVME if config.optimizer != "cpu" else P.SLIDING
    if config.schedule == "gpu-only":
        return tuple(P.RESIDENT for _ in resident_preference(model))
    if config.schedule == "zero-offload":
        host = P.NVME if config.optimizer != "cpu" else P.OFFLOADED
    resident, streamed = set(ledger.resident), set(ledger.streamed)
    return tuple(
        P.RESIDENT if u in resident else P.STREAMED if u in streamed else host
        for u in sorted(resident_preference(model))
    )


def model_flops_per_step(model: ModelSpec, config: TrainConfig) -> float:
    """Forward + backward FLOPs of one optimizer step, recompute not counted."""
    b, s = config.batch, config.seq
    layers = model.num_layers * (model.layer_fwd_flops(b, s) + model.layer_bwd_flops(b, s))
    head = model.head_fwd_flops(b, s) + model.head_bwd_flops(b, s)
    return config.grad_accum * (layers + head)


# -- saved plans -----------------------------------------------------------------------------
def plan_to_json(p: Plan) -> str:
    """Everything needed to re-plan (model config, machine profile, train config) + the graph."""
    return json.dumps(
        {
            "version": PLAN_VERSION,
            "model": p.model.to_hf_config(),
            "model_name": p.model.name,
            "machine_toml": machine_to_toml(p.machine),
            "config": asdict(p.config),
            "graph": json.loads(p.graph.to_json()),
        }
    )


PLAN_KEYS = ("version", "model", "model_name", "machine_toml", "config", "graph")


def plan_from_json(text: str) -> Plan:
    """Re-plan from the saved inputs; the graph must come out equal to the saved one.

    Text that is not such a plan (not JSON, another document, a field missing or mistyped) is a
    ValueError saying what is wrong, for the caller to prefix with the file's name."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"not a saved plan: a JSON {type(data).__name__}, not an object")
    missing = [k for k in PLAN_KEYS if k not in data]
    if missing:
        raise ValueError(f"not a saved plan: no {', '.join(map(repr, missing))} field")
    if data["version"] != PLAN_VERSION:
        found = data["version"]
        raise ValueError(
            f"plan format version {found!r} unsupported (this Slide reads {PLAN_VERSION})"
        )
    name = _saved_field("model_name", lambda: _text(data, "model_name"))
    origin = "HF config"
    model = _saved_field(
        "model", lambda: ModelSpec.from_hf_config(data["model"], name=name, origin=origin)
    )
    machine = _saved_field("machine_toml", lambda: load_machine_toml(_text(data, "machine_toml")))
    config = _saved_field("config", lambda: TrainConfig(**data["config"]))
    graph = _saved_field("graph", lambda: Graph.from_json(json.dumps(data["graph"])))
    p = plan(model, machine, config)
    if p.graph != graph:
        raise ValueError("saved plan's graph differs from a fresh plan of its inputs (edited?)")
    return p


def _text(data: dict[str, Any], key: str) -> str:
    if not isinstance(data[key], str):
        raise ValueError(f"expected a string, got {type(data[key]).__name__}")
    return str(data[key])


def _saved_field(name: str, parse: Callable[[], T]) -> T:
    try:
        return parse()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"the plan's {name!r} field is malformed: {what}") from exc
