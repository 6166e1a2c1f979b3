"""`slide layout`: plan, verdict with advice, search, and one-line errors."""

from __future__ import annotations

import json

import pytest

from slide.cli import main


def run(capsys, *args):
    code = main(["layout", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_published_30b_layout_fits_and_is_predicted(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-30b-a3b", "--gpus", "8", "--tp", "2", "--cp",
                       "4", "--ep", "8", "--seq", "131072", "--cpu-adam", "--recompute",
                       "--distributed-optimizer", "--global-batch", "8", "--json")  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert result["fits"] and result["gpu_terms"]["master"] == 0
    assert result["host_per_node"] > 0
    assert result["predicted"]["step_time_s"] > 0 and 0 < result["predicted"]["mfu"] < 1


def test_overflow_gives_advice_that_fits(capsys):
    code, out, _ = run(capsys, "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "4096")
    assert code == 1  # as `slide plan`'s infeasible plan: a result, not a user error (2)
    assert "does not fit" in out and "try --" in out and ", fits" in out


def test_search_lists_layouts(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "8192",
                       "--recompute", "--distributed-optimizer", "--search", "--top", "3")  # fmt: skip
    assert code == 0
    assert out.count("tok/s/GPU") == 3


def test_search_front_lists_time_against_memory(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "131072",
                       "--cpu-adam", "--recompute", "--distributed-optimizer", "--global-batch",
                       "8", "--search", "--front", "--json")  # fmt: skip
    rows = json.loads(out)["search"]
    assert code == 0 and len(rows) >= 2
    steps, gib = [r["step_time_s"] for r in rows], [r["gpu_gib"] for r in rows]
    assert steps == sorted(steps) and gib == sorted(gib, reverse=True)
    assert any(r["layout"].startswith("TP2 PP1 CP4 EP8") for r in rows)  # the published one


def test_invalid_layout_is_one_line_and_exit_2(capsys):
    code, out, err = run(capsys, "--model", "qwen3-30b-a3b", "--gpus", "8", "--ep", "3")
    assert code == 2 and not out
    assert err.count("\n") == 1 and "EP" in err


def test_unknown_model_and_node(capsys):
    assert run(capsys, "--model", "qwen3-30b", "--gpus", "8")[0] == 2
    assert run(capsys, "--model", "qwen3-30b-a3b", "--gpus", "8", "--machine", "x")[0] == 2


def test_uneven_split_and_interleaving(capsys):
    """GLM-5's 78 layers on PP8 need an explicit split; the interleaved bubble is reported."""
    args = ("--model", "glm-5", "--gpus", "256", "--tp", "4", "--pp", "8", "--cp", "8", "--ep",
            "32", "--seq", "131072", "--cpu-adam", "--recompute", "--distributed-optimizer",
            "--global-batch", "64")  # fmt: skip
    code, _, err = run(capsys, *args)
    assert code == 2 and "--pp-layers 9,10,10,10,10,10,10,9" in err
    code, out, _ = run(capsys, *args, "--pp-layers", "9,10,10,10,10,10,10,9",
                       "--virtual-stages", "2", "--deepep", "--json")  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert "PP8[9,10,10,10,10,10,10,9] v2" in result["layout"] and "deepep" in result["layout"]
    assert result["fits"]
    assert result["predicted"]["bubble"] == 7 / (2 * 64 + 7)


def test_bad_stage_list_is_one_line(capsys):
    code, out, err = run(capsys, "--model", "llama-3.1-8b", "--gpus", "8", "--pp", "2",
                         "--pp-layers", "16,x")  # fmt: skip
    assert code == 2 and not out and err.count("\n") == 1 and "--pp-layers" in err


def test_selective_recompute_sits_between_none_and_full(capsys):
    base = ["--model", "qwen3-30b-a3b", "--gpus", "8", "--tp", "2", "--cp", "4", "--ep", "8",
            "--seq", "32768", "--cpu-adam", "--distributed-optimizer", "--global-batch", "8",
            "--json"]  # fmt: skip
    got = {}
    for name, extra in (("none", []), ("selective", ["--recompute-modules", "layernorm", "moe"]),
                        ("full", ["--recompute"])):  # fmt: skip
        code, out, _ = run(capsys, *base, *extra)
        assert code == 0
        got[name] = json.loads(out)
    assert "recompute(layernorm,moe)" in got["selective"]["layout"]
    step = {k: v["predicted"]["step_time_s"] for k, v in got.items()}
    gpu = {k: v["gpu_bytes"] for k, v in got.items()}
    assert step["none"] < step["selective"] < step["full"]
    assert gpu["none"] > gpu["selective"] > gpu["full"]


def test_selective_recompute_of_moe_on_a_dense_model_is_refused(capsys):
    code, _, err = run(capsys, "--model", "llama-3.1-8b", "--gpus", "8", "--tp", "8",
                       "--recompute-modules", "moe")  # fmt: skip
    assert code == 2 and "need an MoE model" in err
    with pytest.raises(SystemExit) as refused:  # argparse: the two exclude each other
        main(["layout", "--model", "llama-3.1-8b", "--gpus", "8", "--recompute",
              "--recompute-modules", "layernorm"])  # fmt: skip
    assert refused.value.code == 2
