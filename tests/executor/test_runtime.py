"""The lane runtime: handler coverage, races, serialisation, failures, stopping and resuming."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time

import pytest
import torch
from runs import B, S, assert_bitwise_equal, batches, graph_of, run_executor

from executor import handlers
from executor.adam import AdamWConfig
from executor.completion import WaitTimeout
from executor.run import DataError, InfeasiblePlanError, NonFiniteLossError
from slide.session import train
from slide_ir import OpKind, TrainConfig, load_machine, load_model
from slide_ir.ir.graph import Graph
from slide_ir.ir.trace import trace_violations
from slide_ir.planning.data_parallel import plan_data_parallel
from slide_ir.planning.programs import eval_graph

# Lanes of every kind at once: sliding + resident units, NVMe activations, micro-batches.
BUSY = {"drives": 2, "activations": "nvme", "grad_accum": 2, "resident": 1, "steps": 4}
# Streamed updates: six ops per streamed unit and step across three lanes.
STREAMED = {"streamed": 3, "steps": 4, "grad_buffers": 1}


# one of each plan family the executor runs: their graphs hold every op kind it has a handler for
FAMILIES = [
    {**BUSY, "placement": "small"},
    STREAMED,
    {"schedule": "zero-offload"},
    {"schedule": "gpu-only"},
    {"optimizer": "nvme", "drives": 2, "placement": "small"},
    {"optimizer": "nvme-moments", "drives": 1},
    {"clip": "global", "resident": 1, "grad_accum": 2},  # per-unit norms, the step's norm
]


def test_handlers_cover_what_the_plans_emit_and_nothing_more() -> None:
    emitted = {op.kind for config in FAMILIES for op in graph_of(False, **config).ops}
    dp = plan_data_parallel(
        load_model("tiny-llama"),
        load_machine("h200-16c-128g"),
        TrainConfig(batch=4, seq=64, steps=2, placement="small"),
        2,
    )
    emitted |= {op.kind for op in dp.graph.ops}
    emitted |= {op.kind for op in eval_graph(dp.base, 2).ops}  # the eval loss's forward-only graph
    assert emitted == set(handlers.HANDLERS)


def test_an_op_the_executor_cannot_run_is_refused_before_it_runs() -> None:
    graph = graph_of(False)
    op = next(op for op in graph.ops if op.lane == "gpu")
    alien = Graph.unchecked(
        info=graph.info,
        pools=graph.pools,
        ops=(*graph.ops, dataclasses.replace(op, id="s1.moe.a2a", kind=OpKind.ALL_TO_ALL)),
    )
    with pytest.raises(handlers.UnsupportedOpError, match="runs no all_to_all op"):
        handlers.lower(alien)


def test_random_delays_in_every_lane_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing dependencies would show up as different results under shuffled timing."""
    calm = run_executor(False, **BUSY)
    monkeypatch.setenv("SLIDE_RANDOM_DELAY_MS", "3")
    for seed in ("1", "2"):
        monkeypatch.setenv("SLIDE_DELAY_SEED", seed)
        assert_bitwise_equal(run_executor(False, **BUSY), calm)


@pytest.mark.parametrize("activations", ["cpu", "gpu"], ids=["inputs-on-host", "inputs-on-device"])
def test_random_delays_change_nothing_with_streamed_updates(
    monkeypatch: pytest.MonkeyPatch, activations: str
) -> None:
    calm = run_executor(True, **STREAMED, activations=activations)
    monkeypatch.setenv("SLIDE_RANDOM_DELAY_MS", "3")
    monkeypatch.setenv("SLIDE_DELAY_SEED", "3")
    assert_bitwise_equal(run_executor(True, **STREAMED, activations=activations), calm)


def test_serialised_run_equals_overlapped_run(monkeypatch: pytest.MonkeyPatch) -> None:
    overlapped = run_executor(True, **BUSY)
    monkeypatch.setenv("SLIDE_SERIAL", "1")
    serial = run_executor(True, **BUSY)
    assert_bitwise_equal(serial, overlapped)
    graph = graph_of(True, **BUSY)
    assert trace_violations(overlapped.trace, graph) == []
    assert trace_violations(serial.trace, graph) == []
    spans = {s.op_id: s for s in serial.trace.spans}
    listed = [spans[op.id] for op in graph.ops if op.id in spans]
    assert len(listed) == len(spans) > 0  # the trace window: steps 1-4, every op of them
    late = [(a.op_id, b.op_id) for a, b in itertools.pairwise(listed) if b.start < a.end]
    assert late == []  # serial: each op starts after the op before it in the list ended


def test_failing_lane_stops_the_run_and_names_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    real = handlers.HANDLERS[OpKind.ADAM]

    def broken(env, lane, op):  # type: ignore[no-untyped-def]
        if op.id == "s2.L3.adam":
            raise RuntimeError("disk on fire")
        real(env, lane, op)

    monkeypatch.setitem(handlers.HANDLERS, OpKind.ADAM, broken)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="disk on fire") as info:
        run_executor(False, steps=3, streamed=0)
    assert "while running s2.L3.adam on cpu" in info.value.__notes__
    assert threading.active_count() == before  # every lane thread has ended


def test_wait_timeout_names_the_waiter(monkeypatch: pytest.MonkeyPatch) -> None:
    real = handlers.HANDLERS[OpKind.D2H_GRAD]

    def slow(env, lane, op):  # type: ignore[no-untyped-def]
        if op.id == "s1.L4.g.d2h":
            time.sleep(1.0)
        real(env, lane, op)

    monkeypatch.setitem(handlers.HANDLERS, OpKind.D2H_GRAD, slow)
    monkeypatch.setenv("SLIDE_WAIT_TIMEOUT_S", "0.2")
    with pytest.raises(WaitTimeout, match=r"waited more than 0\.2 s for s1\.L4\.g\.d2h"):
        run_executor(False, steps=1)


@pytest.mark.parametrize(
    "config",
    [{}, {"streamed": 3, "clip": "global", "clip_norm": 0.05, "speculate": 0}],
    ids=["sliding", "streamed-global-clipping"],
)
def test_on_step_stop_leaves_the_state_of_the_steps_done(config: dict) -> None:
    """Stopping is clean: the weights equal an uninterrupted run of as many steps (streamed
    units under global clipping too: their updates after the norm need nothing of the next
    step)."""
    stopped = run_executor(False, train_kwargs={"on_step": lambda step, *_: step >= 2}, **config)
    assert stopped.steps_done in (2, 3)  # the step already handed to the lanes also finishes
    assert_bitwise_equal(stopped, run_executor(False, steps=stopped.steps_done, **config))


@pytest.mark.parametrize(
    "config",
    [{"resident": 0}, {"resident": 2}, {"optimizer": "nvme", "drives": 2, "resident": 1}],
    ids=["sliding", "resident", "nvme"],
)
def test_resume_equals_uninterrupted_run(config: dict) -> None:
    """Two calls (3 + 3 steps, weights, moments and step count handed over) = one of 6; with
    resident units, their moments go to the device's state (fresh ones start there as zero);
    with the state on NVMe, the hand-over reads it out of the drive files and the second call
    writes it back into new ones."""
    optim = AdamWConfig(lr=1e-3, schedule="cosine", warmup_steps=2, total_steps=6, weight_decay=0.1)
    whole = run_executor(False, steps=6, train_kwargs={"optim": optim}, **config)
    first = run_executor(False, steps=3, train_kwargs={"optim": optim}, **config)
    second = run_executor(
        False,
        steps=3,
        first_batch=3,
        **config,
        train_kwargs={
            "optim": optim,
            "initial_state": first.final_state,
            "initial_optim_state": first.optim_state,
            "start_step": 3,
        },
    )
    assert first.losses + second.losses == whole.losses
    assert first.lrs + second.lrs == whole.lrs
    for name, t in whole.final_state.items():
        assert torch.equal(t, second.final_state[name]), name


def test_trace_has_one_span_per_op() -> None:
    result = run_executor(False, steps=2)
    spans = result.trace.spans
    assert len({s.op_id for s in spans}) == len(spans)
    assert {s.lane for s in spans} == {"gpu", "h2d", "d2h", "cpu"}
    assert all(s.end >= s.start for s in spans)


def test_infeasible_plan_is_refused_before_allocating() -> None:
    model = load_model("llama-3.1-405b")
    with pytest.raises(InfeasiblePlanError, match=r"on --device cpu it needs .* GiB more than"):
        train(
            model,
            load_machine("h200-16c-128g"),
            TrainConfig(batch=1, seq=128, steps=1),
            initial_state={},
            batches=[],
            device="cpu",
        )


def test_nonfinite_loss_stops_the_run() -> None:
    from hf_models import hf_model, state_dict_fp32
    from runs import model_config

    state = state_dict_fp32(hf_model(model_config(False)))
    state["model.norm.weight"][0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="step 1: loss is nan"):
        run_executor(False, steps=2, train_kwargs={"initial_state": state})


def test_data_that_runs_out_is_an_error() -> None:
    with pytest.raises(DataError, match="ran out at step 3"):
        run_executor(False, steps=3, train_kwargs={"batches": batches(2)})


def test_batches_of_the_wrong_shape_are_refused() -> None:
    bad = [(torch.zeros(B, S + 1, dtype=torch.int64), torch.zeros(B, S + 1, dtype=torch.int64))]
    with pytest.raises(DataError, match="input_ids must be int64"):
        run_executor(False, steps=1, train_kwargs={"batches": bad})


def test_lr_schedules() -> None:
    warm = AdamWConfig(lr=1.0, schedule="linear", warmup_steps=2)
    assert [warm.lr_at(s, 6) for s in range(1, 7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    cos = AdamWConfig(lr=1.0, schedule="cosine")
    assert cos.lr_at(1, 4) == 1.0 and cos.lr_at(3, 4) == pytest.approx(0.5)
    assert AdamWConfig(lr=2.0).lr_at(100, 5) == 2.0
    with pytest.raises(ValueError, match="schedule must be one of"):
        AdamWConfig(schedule="step")
