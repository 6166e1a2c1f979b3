"""`slide rollout`: the engine ledger and verdict, the pools, the search, one-line errors."""

from __future__ import annotations

import json

import pytest

from slide.cli import main

RECIPE_30B = ["--model", "qwen3-30b-a3b", "--gpus", "8", "--engine-gpus", "8", "--engine-tp",
              "2", "--engine-ep", "8", "--response-len", "32768", "--tp", "2", "--cp", "4",
              "--ep", "8", "--cpu-adam", "--recompute", "--distributed-optimizer"]  # fmt: skip


def run(capsys, *args):
    code = main(["rollout", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_colocated_recipe_fits_and_reports_the_step(capsys):
    code, out, _ = run(capsys, *RECIPE_30B, "--json")
    assert code == 0
    got = json.loads(out)
    assert got["fits"] and got["engines"] == 1
    assert set(got["engine_terms"]) == {"weights", "kv_cache", "workspace", "allocator", "context"}
    pools = got["pools"]
    assert pools["mode"] == "colocated" and pools["fits"]
    assert pools["peak_bytes"] == max(pools["phases"].values())
    assert pools["step_s"] == pytest.approx(
        pools["rollout_s"] + pools["train_s"] + pools["switch_s"] + pools["sync_s"]
    )


def test_split_pools_train_on_the_rest(capsys):
    code, out, _ = run(capsys, "--model", "llama-3.1-8b", "--gpus", "16", "--engine-gpus", "1",
                       "--rollout-gpus", "8", "--tp", "2", "--recompute", "--json")  # fmt: skip
    assert code == 0
    pools = json.loads(out)["pools"]
    assert pools["mode"] == "split" and pools["train_gpus"] == 8 and pools["switch_s"] == 0


def test_overflow_names_the_kv_cache_and_advises(capsys):
    code, out, _ = run(capsys, "--model", "llama-3.1-8b", "--gpus", "8", "--engine-gpus", "2",
                       "--response-len", "131072", "--concurrency", "64")  # fmt: skip
    assert code == 0
    assert "does not fit: kv_cache overflows" in out and "try --kv-dtype fp8" in out
    assert "try --concurrency 16" in out and "colocated" not in out


def test_search_ranks_plans(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-30b-a3b", "--gpus", "8", "--response-len",
                       "16384", "--cpu-adam", "--recompute", "--distributed-optimizer",
                       "--search", "--top", "3")  # fmt: skip
    assert code == 0
    assert out.count(" s = rollout ") == 3 and "fastest step first" in out


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--engine-gpus", "3"], "--engine-gpus must divide the 8 rollout GPUs"),
        (["--engine-gpus", "8", "--engine-tp", "3"], "--engine-tp must divide the 8 GPUs"),
        (["--engine-gpus", "1", "--engine-ep", "2"], "--engine-ep must be 1 for the dense"),
        (["--rollout-gpus", "8"], "--rollout-gpus must be between 1 and"),
        (["--engine-gpus", "1", "--tp", "3"], "training layout: dense layers need"),
        (["--prompts", "0"], "prompts must be an integer >= 1"),
        (["--gpus", "0"], "--gpus must be >= 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    base = ["--model", "llama-3.1-8b", "--gpus", "8"]
    code, out, err = run(capsys, *base, *args)
    assert code == 2 and not out and err.count("\n") == 1 and words in err
