"""The data path in the graph: the host token slots the driver stages micro-batches in, the GPU
tokens slot, the step losses and their host copies are pools with a shape and a dtype, and the
embedding of step s reads its staged slot only after the step that last used it (s - 1 -
feed_ahead) has ended on every lane: the edges the executor's driver keeps, which the
simulator runs too."""

import math

import pytest

from simulator.engine import simulate
from slide_ir.ir.graph import FEED_AHEAD, Dtype, Graph, OpKind, PoolRole, Role, Tier
from slide_ir.planning.cost import CostModel
from slide_ir.planning.planner import plan
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model

R = PoolRole
ITEMSIZE = {Dtype.COMPUTE: 2, Dtype.FP32: 4, Dtype.INT64: 8}  # the ledger's compute dtype: BF16
CASES = [
    {"activations": "cpu"},
    {"activations": "gpu", "grad_accum": 3},
    {"activations": "nvme", "optimizer": "nvme", "document_mask": True},
    {"clip": "global", "resident": 2},
]


def _plan(**config: object):  # type: ignore[no-untyped-def]
    model = load_model("llama-3.2-1b")
    machine = load_machine("paper-pc-4090", nvme=2)
    return plan(model, machine, TrainConfig(batch=2, seq=128, steps=5, **config))  # type: ignore[arg-type]


@pytest.mark.parametrize("config", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_a_shaped_pools_slot_is_its_shape_at_its_dtype(config: dict) -> None:
    g = _plan(**config).graph
    shaped = [p for p in g.pools if p.shape]
    roles = {p.role for p in shaped}
    assert {R.TOKENS, R.HOST_TOKENS, R.LOSSES, R.HOST_LOSSES, R.HIDDEN, R.HIDDEN_GRAD} <= roles
    for p in shaped:
        assert math.prod(p.shape) * ITEMSIZE[p.dtype] == p.slot_bytes, p
    fields = 3 if config.get("document_mask") else 2
    tokens = {p.role: p for p in shaped if p.role in (R.TOKENS, R.HOST_TOKENS)}
    assert tokens[R.TOKENS].shape == tokens[R.HOST_TOKENS].shape == (fields, 2, 128)
    assert tokens[R.HOST_TOKENS].tier == Tier.PINNED
    assert tokens[R.HOST_TOKENS].slots == (FEED_AHEAD + 1) * g.info.grad_accum


@pytest.mark.parametrize("config", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_each_micro_batch_reads_its_staged_slot_after_the_step_that_used_it(config: dict) -> None:
    g = _plan(**config).graph
    ga, steps = g.info.grad_accum, g.info.steps
    embeds = [op for op in g.ops if op.kind == OpKind.FWD and op.unit == 0]
    fed = {(op.step, op.micro): op.read_as(Role.FEED) for op in embeds}
    assert sorted(fed) == [(s, m) for s in range(1, steps + 1) for m in range(ga)]
    slots = {(s, m): v.slot for (s, m), v in fed.items() if v is not None}
    window = FEED_AHEAD + 1
    for first in range(1, steps - window + 2):  # the window's micro-batches: a slot each
        held = [slots[(t, m)] for t in range(first, first + window) for m in range(ga)]
        assert len(set(held)) == len(held)
    for (s, m), slot in slots.items():  # and the next window's reuse them in turn
        assert s <= window or slot == slots[(s - window, m)]
    for op in embeds:
        if op.micro or op.step <= window:
            continue
        before = op.step - window
        tails = {lane: ops[-1].id for lane in g.lanes()
                 if (ops := [o for o in g.lane_ops(lane) if o.step == before])}  # fmt: skip
        assert set(tails.values()) <= set(op.deps), (op.id, tails)


def _last_micro(g: Graph) -> dict[int, int]:
    return {s: g.info.grad_accum - 1 for s in range(1, g.info.steps + 1)}


@pytest.mark.parametrize("config", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_a_step_adds_its_micro_batches_losses_and_copies_the_sum_once(config: dict) -> None:
    g = _plan(**config).graph
    losses = [op for op in g.ops if op.kind == OpKind.LOSS]
    for op in losses:
        loss, host = op.written_as(Role.LOSS), op.written_as(Role.HOST_LOSS)
        assert loss is not None and loss.accumulate == (op.micro > 0)
        assert loss.slot.endswith(f".{op.step - 1}")  # a slot per step of the pass
        assert (host is not None) == (op.micro == _last_micro(g)[op.step])
    hosts = [op.step for op in losses if op.written_as(Role.HOST_LOSS)]
    assert hosts == list(range(1, g.info.steps + 1))


def test_the_simulator_starts_an_embedding_after_the_step_its_slot_waits_for() -> None:
    p = _plan(activations="cpu")
    trace = simulate(p.graph, CostModel(p.machine))
    spans = {s.op_id: s for s in trace.spans}
    window = FEED_AHEAD + 1
    for op in p.graph.ops:
        if op.kind == OpKind.FWD and op.unit == 0 and op.step > window:
            ended = max(spans[o.id].end for o in p.graph.ops if o.step == op.step - window)
            assert spans[op.id].start >= ended - 1e-12, op.id
