"""Global clipping's schedule: a norm per unit, one per step, every update after it, the
landing buffers the wait needs, and what the mode refuses."""

from __future__ import annotations

from dataclasses import replace

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
    none = _plan(resident=0, streamed=0)
    global_ = _plan(resident=0, streamed=0, clip="global", speculate=0)
    costs = CostModel(load_machine(MACHINE))
    assert predict_step_s(global_.graph, costs) > predict_step_s(none.graph, costs)


def test_streamed_units_update_after_the_norm_on_the_copy_lane() -> None:
    """A streamed unit keeps its cache unit through the step; its state comes up through two
    GPU slots, its GPU AdamW waits for the norm on the `h2d` lane (the compute lane goes on
    with the next forward), and the unit's next forward reads the weights where the update
    wrote them (no upload, no gradient download). Nothing of a step waits for the next one's
    ops (a save between steps waits for that step alone)."""
    p = _plan(clip="global", speculate=0, resident=2, streamed=5)
    graph, n = p.graph, p.model.num_layers
    streamed = [u for u, where in enumerate(graph.info.placement) if where == "streamed"]
    assert streamed == [2, 3, 4, 5, 6]
    assert graph.pool("gpu_opt_layers").slots == 2
    by_id = {op.id: op for op in graph.ops}
    index = {op.id: i for i, op in enumerate(graph.ops)}
    for u in streamed:
        assert not any(op.kind in (K.D2H_GRAD, K.H2D_PARAM) and op.unit == u and op.step == 2
                       for op in graph.ops)  # fmt: skip
        adam = by_id[f"s1.L{u}.gpu_adam"]
        assert "s1.norm" in adam.deps and adam.lane == "h2d"
        (grad,) = [v for v in adam.reads if v.name == f"L{u}.g"]
        assert grad.slot.startswith("gpu_units")
        forward = by_id[f"s2.L{u}.fwd"]
        assert adam.id in forward.deps and index[adam.id] < index[forward.id]
        assert any(v.slot == grad.slot for v in forward.reads)
    first_of_step_2 = min(i for i, op in enumerate(graph.ops) if op.step == 2)
    assert all(index[a] < first_of_step_2 for op in graph.ops if op.step == 1
               for a in [op.id])  # fmt: skip
    # after the graph's last step the new weights go down for the next pass's uploads
    last = graph.info.steps
    assert all(f"s{last}.L{u}.w.d2h" in by_id for u in streamed)
    assert n > len(streamed)


def test_search_streams_where_the_gpu_is_short() -> None:
    """A 24 GB budget: streamed units (4 B/param of GPU memory until their update after the
    norm) are faster than the best placement without them, by the search's own timing."""
    machine = load_machine(MACHINE)
    config = TrainConfig(batch=16, seq=1024, steps=2, clip="global", speculate=0,
                         gpu_memory_gb=24)  # fmt: skip
    model = load_model("llama-3.2-3b")
    searched = plan(model, machine, config)
    without = plan(model, machine, replace(config, streamed=0))
    assert searched.config.streamed > 0
    assert searched.choice.predicted_step_s < 0.9 * without.choice.predicted_step_s


def test_data_parallel_ranks_do_not_stream_under_global_clipping() -> None:
    machine, model = load_machine(MACHINE), load_model(MODEL)
    config = TrainConfig(batch=4, seq=512, steps=2, clip="global", streamed=2)
    with pytest.raises(ValueError, match="streamed=2 with clip 'global' runs on one GPU only"):
        plan(model, machine, config, nproc=2)
    assert plan(model, machine, replace(config, streamed="auto"), nproc=2).config.streamed == 0


@pytest.mark.parametrize(
    "extra",
    [{"clip": "global", "streamed": 6, "speculate": 0}, {"clip": "global", "speculate": 3},
     {"clip": "per-unit", "streamed": 4}, {"clip": "global", "grad_accum": 2}],
    ids=["streamed-global", "speculated", "streamed-per-unit", "accum"],
)  # fmt: skip
def test_no_op_of_a_step_comes_after_the_next_steps_first(extra: dict) -> None:
    """What a save or a stop between two steps relies on (the executor waits for the first
    step's ops without feeding the next's data): every op of step s is listed, and so runs on
    its lane, before any op of step s + 1."""
    graph = _plan(resident=2, **extra).graph
    first = {}
    for i, op in enumerate(graph.ops):
        first.setdefault(op.step, i)
    for i, op in enumerate(graph.ops):
        assert op.step + 1 not in first or i < first[op.step + 1], op.id
