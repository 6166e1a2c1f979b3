"""A plan file (`slide plan --out`) that is not one: `plan_from_json` raises a ValueError saying
what is wrong, in one line, for `slide train --plan` to prefix with the file's name."""

import json

import pytest

from slide.cli import main
from slide_ir.planning.planner import plan_from_json


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "p.json"
    argv = ["plan", "--model", "qwen2.5-0.5b", "--batch", "2", "--seq", "128", "--steps", "1",
            "--placement", "small"]  # fmt: skip
    assert main([*argv, "--out", str(path), "--json"]) == 0
    return json.loads(path.read_text())


def edited(doc, key, value):
    return json.dumps({**doc, key: value})


CASES = {
    "empty": (lambda d: "", "not JSON"),
    "text": (lambda d: "hello\n", "not JSON"),
    "truncated": (lambda d: json.dumps(d)[:300], "not JSON"),
    "a list": (lambda d: "[1, 2]", "not a saved plan: a JSON list"),
    "another document": (lambda d: '{"version": 1, "ops": []}', "no 'model', 'model_name'"),
    "newer format": (lambda d: edited(d, "version", 9), "plan format version 9 unsupported"),
    "model not an object": (lambda d: edited(d, "model", 5), "'model' field is malformed"),
    "model_name not text": (lambda d: edited(d, "model_name", 5), "'model_name' field"),
    "machine not TOML": (lambda d: edited(d, "machine_toml", "[gpu"), "'machine_toml' field"),
    "machine not text": (lambda d: edited(d, "machine_toml", {}), "expected a string, got dict"),
    "config unknown key": (
        lambda d: edited(d, "config", {**d["config"], "bogus": 1}),
        "'config' field is malformed",
    ),
    "config bad batch": (
        lambda d: edited(d, "config", {**d["config"], "batch": "16"}),
        "batch must be a positive integer",
    ),
    "graph garbage": (lambda d: edited(d, "graph", [1]), "'graph' field is malformed"),
    "graph edited": (
        lambda d: edited(d, "graph", {**d["graph"], "ops": d["graph"]["ops"][:-1]}),
        "'graph' field is malformed",
    ),
    "graph not the plan's": (
        lambda d: edited(d, "config", {**d["config"], "cache_units": 2}),
        "graph differs from a fresh plan",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_plan_file_says_what_is_wrong(saved, case):
    make, needle = CASES[case]
    with pytest.raises(ValueError) as err:
        plan_from_json(make(saved))
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_the_saved_plan_itself_loads(saved):
    p = plan_from_json(json.dumps(saved))
    assert p.model.name == "qwen2.5-0.5b" and p.config.batch == 2
