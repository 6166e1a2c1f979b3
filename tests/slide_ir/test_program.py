"""The Program: the pass graphs a run needs, planned once, printed and read back."""

from __future__ import annotations

import dataclasses

import pytest

from slide_ir.planning import programs
from slide_ir.planning.planner import plan, steady_step_s
from slide_ir.program import Program, ProgramError, next_pass
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model


def _plan(steps: int, **config: object):  # type: ignore[no-untyped-def]
    return plan(
        load_model("tiny-llama"),
        load_machine("h200-16c-128g"),
        TrainConfig(batch=2, seq=64, steps=steps, **config),  # type: ignore[arg-type]
    )


def test_a_pass_is_the_whole_graph_or_what_is_left():
    assert next_pass(64, 0, 100) == 64
    assert next_pass(64, 64, 100) == 36
    assert next_pass(8, 6, 7) == 1


def test_pass_lengths_name_each_pass_once_in_the_order_taken():
    # the check's 6 steps, then 64 + 30 to step 100
    assert programs.pass_lengths(64, [6, 100]) == [6, 64, 30]
    assert programs.pass_lengths(3, [10]) == [3, 1]
    assert programs.pass_lengths(10, [10], done=6) == [4]
    assert programs.pass_lengths(64, [64, 128]) == [64]


def test_a_program_holds_the_whole_graph_and_every_pass_of_its_stops():
    p = _plan(10)
    prog = programs.program(p, [6, 10], cpu_threads=3)
    assert sorted(prog.passes) == [4, 6, 10]
    assert prog.graph == p.graph  # the repeated graph is the plan's own
    assert all(g.info.steps == n for n, g in prog.passes.items())
    assert prog.cpu_threads == 3
    assert prog.gpu_bytes == p.ledger.peak_bytes("gpu")
    assert prog.machine == "h200-16c-128g"
    assert prog.placement["chosen"]  # what the search chose, for the run's report
    moved = programs.program(p, [10], done=6, cpu_threads=3)
    assert sorted(moved.passes) == [4, 10]  # steps go on numbered in the whole graph


def test_a_missing_pass_is_named():
    prog = programs.program(_plan(4), [4], cpu_threads=None)
    with pytest.raises(ProgramError, match=r"no 3-step pass in this Program \(it has \[4\]\)"):
        prog.pass_graph(3)


def test_passes_must_agree_with_their_graphs_and_pools():
    p = _plan(4)
    prog = programs.program(p, [4], cpu_threads=None)
    with pytest.raises(ProgramError, match="pass 5's graph covers 4 steps"):
        dataclasses.replace(prog, passes={5: p.graph})
    other = _plan(3, placement="small").graph
    with pytest.raises(ProgramError, match="the same pools"):
        dataclasses.replace(prog, passes={4: p.graph, 3: other})


def test_a_program_prints_and_reads_back():
    prog = programs.program(_plan(10), [6, 10], cpu_threads=2)
    back = Program.from_json(prog.to_json())
    assert back.passes == prog.passes
    assert back.model.to_hf_config() == prog.model.to_hf_config()
    assert back.model.total_params == prog.model.total_params
    for field in ("cpu_threads", "drives", "gpu_bytes", "machine", "placement"):
        assert getattr(back, field) == getattr(prog, field), field
    with pytest.raises(ProgramError, match="program format version 0 unsupported"):
        Program.from_json(prog.to_json().replace('"version":1', '"version":0', 1))


@pytest.mark.parametrize("placement", ["fast", "small"])
def test_a_program_carries_its_plans_predicted_step(placement):
    """A run is set against the step its plan predicts: the search's choice, and a placement
    no search timed (`small`) by its own graph, both as `steady_step_s` times them; none for a
    run that is not on the machine planned for."""
    p = _plan(3, placement=placement)
    told = programs.program(p, [3], cpu_threads=None).placement["predicted_step_s"]
    assert told is not None and told == pytest.approx(steady_step_s(p, 1), rel=1e-12) and told > 0
    if placement == "fast":
        assert told == p.choice.predicted_step_s
    hidden = programs.program(p, [3], cpu_threads=None, predicted=False).placement
    assert hidden["predicted_step_s"] is None
