"""Every JSON slide prints or writes parses as strict JSON: an eta with nothing offloaded (inf)
is null, not Python's `Infinity`."""

import json

from slide.cli import main
from slide.json_out import dumps


def strict(text):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_are_null():
    assert strict(dumps({"eta": float("inf"), "rows": [float("nan"), 1.5]})) == {
        "eta": None,
        "rows": [None, 1.5],
    }


def test_plan_and_simulate_json_with_nothing_offloaded(capsys):
    for command in ("plan", "simulate"):
        assert main([command, "--json", "--schedule", "gpu-only", "--model", "tiny-llama"]) == 0
        strict(capsys.readouterr().out)


def test_train_summary_and_metrics_with_every_unit_resident(tmp_path, tokens, capsys):
    metrics = tmp_path / "m.jsonl"
    argv = ["train", "--device", "cpu", "--resident", "6", "--steps", "2", "--no-progress"]
    assert main([*argv, "--data", tokens, "--metrics", str(metrics)]) == 0
    summary = strict(capsys.readouterr().out)
    assert summary["placement"].startswith("6 resident") and summary["eta"] is None
    for line in metrics.read_text().splitlines():
        strict(line)
