"""Start-up and shutdown timing of `slide train`: the summary's phase tables, and the set-up
work they showed was wasted (weights made to check their shapes, a second copy per unit)."""

import json
import time

import torch

from executor import phases as phases_mod
from executor.layout import unit_layouts
from executor.phases import Phases, since_command_start, since_process_start
from executor.state import check_names, pack
from slide.cli import main
from slide.weights import RandomInit
from slide_ir import load_model


def test_summary_says_where_the_seconds_went(tmp_path, tokens, capsys, caplog):
    caplog.set_level("INFO", logger="slide.phases")
    argv = ["train", "--device", "cpu", "--batch", "2", "--seq", "32", "--steps", "3",
            "--no-progress", "--data", tokens, "--out", str(tmp_path / "ckpt")]  # fmt: skip
    start = time.perf_counter()
    assert main(argv) == 0
    wall = time.perf_counter() - start
    summary = json.loads(capsys.readouterr().out)
    startup, shutdown = summary["startup"], summary["shutdown"]
    # in this long-lived process, from main's call (plus, at most, a young process's age)
    assert startup["imports_s"] <= wall + phases_mod.OWN_PROCESS_S, startup
    for phase in ("imports", "plan", "data", "buffers", "state", "first step"):
        assert startup[f"{phase}_s"] >= 0, startup
    assert startup["to_first_step_s"] <= startup["to_first_step_end_s"]
    first = startup["to_first_step_end_s"] - startup["to_first_step_s"]
    assert abs(first - startup["first step_s"]) <= 1.5e-3 + 1e-9  # three roundings to 1 ms
    assert {"steps_s", "save_s", "release_s", "report_s"} <= shutdown.keys()
    logged = {r.getMessage().rsplit(" ", 2)[0] for r in caplog.records}
    assert {"imports", "state", "first step", "save"} <= logged  # one -v line per phase


def test_phases_add_up_and_process_start_is_in_the_past():
    phases = Phases()
    with phases("a"):
        pass
    phases.add("a", 1.0)
    phases.add("b", 2.0, overlapped=True)
    assert phases.table(("a", "b")) == {"a_s": round(phases.seconds["a"], 3)}
    assert phases.overlapped == {"b": 2.0}
    assert 0 < since_process_start() < 3600


def test_a_command_counts_from_its_process_start_or_from_its_call(monkeypatch):
    age = [0.5]  # the process's age, as /proc gives it
    monkeypatch.setattr(phases_mod, "since_process_start", lambda: age[0])
    monkeypatch.setattr(phases_mod, "_age_before_command", [0.0])
    phases_mod.mark_command_start()  # the `slide` script: from the process's start
    age[0] = 3.0
    assert since_command_start() == 3.0
    age[0] = 900.0
    phases_mod.mark_command_start()  # a notebook's call: from the call
    age[0] = 902.5
    assert since_command_start() == 2.5


class _Counting(RandomInit):
    made = 0

    def __getitem__(self, name):
        type(self).made += 1
        return super().__getitem__(name)


def test_shapes_checked_without_making_weights_and_packed_in_place():
    spec = load_model("tiny-llama")
    layouts = unit_layouts(spec)
    state = _Counting(spec, seed=3)
    check_names(layouts, state, spec.tied_embeddings)
    assert _Counting.made == 0
    for layout in layouts.values():  # written into the buffer given: no temporary
        out = torch.empty(layout.numel)
        assert pack(layout, state, out=out) is out
        plain = {name: RandomInit(spec, seed=3)[name] for name in layout.hf_views(out)}
        assert torch.equal(out, pack(layout, plain))
    assert _Counting.made == 0
