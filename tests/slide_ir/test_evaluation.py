"""The eval graph: the sliding forward alone on the training plan's pools, and what the
simulator predicts of it."""

from __future__ import annotations

import pytest

from simulator.run import simulate_plan
from slide_ir import OpKind, TrainConfig, load_machine, load_model
from slide_ir.ir.graph import PoolRole, Role, Tier
from slide_ir.planning.planner import plan
from slide_ir.planning.programs import eval_graph, program
from slide_ir.program import Program

FORWARD_KINDS = {OpKind.H2D_PARAM, OpKind.FWD, OpKind.EVAL_LOSS}
CASES = [
    {"placement": "small"},
    {"placement": "small", "activations": "nvme", "grad_accum": 2},
    {"resident": 2, "streamed": 2, "keep_activations": 2},
    {"schedule": "zero-offload"},
    {"schedule": "gpu-only"},
]


@pytest.mark.parametrize("config", CASES)
def test_an_eval_graph_is_forward_only_and_frees_what_it_takes(config: dict) -> None:
    model = load_model("qwen2.5-0.5b")  # tied embeddings: the loss reads the embedding's slot
    p = plan(model, load_machine("paper-pc-4090"), TrainConfig(batch=2, seq=256, steps=3, **config))
    g = eval_graph(p, 4)
    assert g.pools == p.graph.pools and g.info.steps == 4 and g.info.grad_accum == 1
    assert {op.kind for op in g.ops} <= FORWARD_KINDS
    losses = [op for op in g.ops if op.kind == OpKind.EVAL_LOSS]
    assert [op.step for op in losses] == [1, 2, 3, 4]
    # an eval loss writes its batch's loss and the host copy, nothing of the model
    assert all({v.role for v in op.writes} == {Role.LOSS, Role.HOST_LOSS} for op in losses)
    taken = {s for op in g.ops for s in op.acquires}
    freed = {s for op in g.ops for s in op.releases}
    assert taken == freed  # nothing held past the eval: the next training pass starts clean
    # (the host copies of the batches' losses are the driver's, which no training op reads)
    homes = {p.name for p in g.pools
             if p.static and p.tier != Tier.GPU and p.role != PoolRole.HOST_LOSSES}  # fmt: skip
    assert not {v.slot.rpartition(".")[0] for op in g.ops for v in op.writes} & homes


def test_a_program_carries_eval_passes_through_json() -> None:
    p = plan(load_model("tiny-llama"), load_machine("h200-16c-128g"),
             TrainConfig(batch=2, seq=64, steps=5, placement="small"))  # fmt: skip
    prog = program(p, [5], cpu_threads=None, eval_batches=70)
    assert sorted(prog.evaluation) == [6, 64] and prog.eval_pass(0, 70) == 64
    assert prog.eval_pass(64, 70) == 6
    assert Program.from_json(prog.to_json()).evaluation == prog.evaluation


def test_simulate_predicts_an_eval_batch_below_a_training_step() -> None:
    s = simulate_plan("llama-3.1-8b", "paper-pc-4090", TrainConfig(batch=16, seq=1024)).summary()
    assert 0 < s["eval_batch_s"] < s["step_time_s"] / 2
