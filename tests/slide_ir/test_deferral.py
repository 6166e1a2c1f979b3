"""Global clipping's schedule: a norm per unit, one per step, every update after it, the
landing buffers the wait needs, and what the mode refuses."""

from __future__ import annotations

import pytest

from slide_ir import TrainConfig, load_machine, load_model
from slide_ir.ir.graph import Graph, OpKind, PoolRole, UnitPlacement
from slide_ir.planning.cost import CostModel
from slide_ir.planning.planner import plan
from slide_ir.planning.timeline import predict_step_s

K = OpKind
MODEL, MACHINE = "llama-3.2-1b", "h200-16c-128g"


def _plan(**extra: object):  # type: ignore[no-untyped-def]
    config = TrainConfig(batch=4, seq=512, steps=2, activations="cpu", **extra)  # type: ignore[arg-type]
    return plan(load_model(MODEL), load_machine(MACHINE), config)


def _ancestors(graph: Graph, op_id: str) -> set[str]:
    by_id = {op.id: op for op in graph.ops}
    seen, todo = set(), [op_id]
    while todo:
        for dep in by_id[todo.pop()].deps:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


@pytest.mark.parametrize("extra", [{"resident": 0}, {"resident": 5, "grad_accum": 2}])
def test_every_update_waits_for_its_steps_norm(extra: dict) -> None:
    graph = _plan(clip="global", speculate=0, **extra).graph
    n = graph.info.num_layers
    for step in (1, 2):
        norms = [op for op in graph.ops if op.kind == K.GRAD_NORM and op.step == step]
        assert sorted(op.unit for op in norms) == list(range(n + 2))
        (norm,) = [op for op in graph.ops if op.kind == K.NORM and op.step == step]
        assert {op.id for op in norms} <= _ancestors(graph, norm.id)
        updates = [op for op in graph.ops if op.kind in (K.ADAM, K.GPU_ADAM) and op.step == step]
        assert len(updates) == n + 2
        for op in updates:
            assert norm.id in op.deps, op.id
            assert any(v.name == f"s{step}.clip" for v in op.reads), op.id
        # the updates run in unit order, the next forward's
        host = [op.unit for op in updates if op.kind == K.ADAM]
        assert host == sorted(host)


def test_landing_buffer_per_host_updated_layer() -> None:
    p = _plan(clip="global", resident=6)
    n, placement = p.model.num_layers, p.graph.info.placement
    host_layers = sum(1 for u in range(1, n + 1) if placement[u] == UnitPlacement.SLIDING)
    assert 0 < host_layers < n
    landing = p.graph.pool("pinned_grads_layers")
    assert landing.role == PoolRole.GRAD_LANDING
    assert landing.slots == host_layers
    assert p.graph.pool("pinned_grad_norms").slots == p.model.num_layers + 2


def test_the_wait_is_priced() -> None:
    """Pure sliding: the host updates overlap the next forward instead of the backward, so the
    prediction is slower than without clipping, by what the simulator finds."""
    none, global_ = _plan(resident=0), _plan(resident=0, clip="global")
    costs = CostModel(load_machine(MACHINE))
    assert predict_step_s(global_.graph, costs) > predict_step_s(none.graph, costs)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"streamed": 2}, "cannot stream units"),
    ],
)
def test_refused(extra: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(batch=4, seq=512, clip="global", **extra)  # type: ignore[arg-type]


def test_search_streams_nothing() -> None:
    p = _plan(clip="global", resident=0)
    assert p.config.streamed == 0
