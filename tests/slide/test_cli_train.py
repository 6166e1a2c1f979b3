"""`slide train` on the CPU: checkpoints transformers can load, resume equal to an uninterrupted
run, metrics per step, bad input refused before the model is built."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from slide.cli import main
from slide.train_report import against_plan, memory_summary, memory_warning, peak_rss_bytes

COMMON = ["--device", "cpu", "--batch", "2", "--seq", "32", "--lr", "1e-3", "--lr-schedule",
          "constant", "--no-shuffle", "--no-progress"]  # fmt: skip


def train(capsys, *argv):
    code = main(["train", *COMMON, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_checkpoint_metrics_and_reload(tmp_path, tokens, capsys):
    from transformers import AutoModelForCausalLM

    out, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    code, stdout, _ = train(
        capsys,
        "--data",
        tokens,
        "--steps",
        "4",
        "--save-every",
        "2",
        "--out",
        str(out),
        "--metrics",
        str(metrics),
    )
    assert code == 0
    summary = json.loads(stdout)
    assert summary["steps_done"] == 4 and summary["steps_run"] == 4
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all({"loss", "lr", "tokens_per_s"} <= r.keys() for r in rows)
    steady = rows[1:]  # the summary's tokens/s: every step after the first, not the trace window's
    assert summary["steady_steps"] == "2-4"
    assert summary["tokens_per_s"] == pytest.approx(
        sum(r["tokens"] for r in steady) / sum(r["step_time_s"] for r in steady), rel=1e-9
    )
    assert (out / "latest").read_text().strip() == "checkpoints/step-000004"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    state = json.loads((out / "checkpoints" / "step-000004" / "slide_state.json").read_text())
    assert state["steps_done"] == 4 and state["total_steps"] == 4
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == 250_432


# the save after step 3 is inside the run's one 6-step pass; streamed units under global
# clipping update after the norm, on the copy lane: the save waits for that step's alone
@pytest.mark.parametrize("extra", [(), ("--streamed", "4", "--speculate", "0")],
                         ids=["defaults", "streamed-global"])  # fmt: skip
def test_resume_equals_an_uninterrupted_run(tmp_path, tokens, capsys, extra):
    whole, half, resumed = tmp_path / "whole", tmp_path / "half", tmp_path / "resumed"
    assert train(capsys, "--data", tokens, "--steps", "6", "--out", str(whole), *extra)[0] == 0
    assert train(capsys, "--data", tokens, "--steps", "6", "--out", str(half), "--save-every",
                 "3", *extra)[0] == 0  # fmt: skip
    shutil.rmtree(half / "checkpoints" / "step-000006")  # as if killed after step 3's save
    code, stdout, _ = train(
        capsys,
        "--data",
        tokens,
        "--steps",
        "6",
        "--resume",
        str(half),
        "--out",
        str(resumed),
        *extra,
    )
    assert code == 0 and json.loads(stdout)["steps_done"] == 6
    a = load_file(str(whole / "model.safetensors"))
    b = load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = (
        load_file(str(whole / "checkpoints" / "step-000006" / "optimizer.safetensors")),
        load_file(str(resumed / "checkpoints" / "step-000006" / "optimizer.safetensors")),
    )
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--data", "/nonexistent/tokens.npy"], "does not exist"),
        (["--clip-norm", "0", "--clip", "per-unit"], "clip_norm must be > 0"),
        (["--betas", "0.9"], "--betas must be two numbers"),
        (["--resume", "/nonexistent/ckpt"], "--resume /nonexistent/ckpt: no such directory"),
        (["--gpu-memory-gb", "100000"], "--gpu-memory-gb 100000 is more than"),
    ],
)
def test_bad_input_is_refused_with_one_line(capsys, argv, needle):
    code, _, err = train(capsys, "--steps", "1", *argv)
    assert code == 2 and needle in err and "Traceback" not in err


def test_resume_with_another_batch_is_refused(tmp_path, tokens, capsys):
    assert train(capsys, "--data", tokens, "--steps", "1", "--out", str(tmp_path / "c"))[0] == 0
    code, _, err = train(
        capsys, "--data", tokens, "--steps", "2", "--resume", str(tmp_path / "c"), "--batch", "4"
    )
    assert code == 2 and "trained with batch=2; leave the flag out" in err


def test_float_token_file_is_refused_before_training(tmp_path, capsys):
    np.save(tmp_path / "f.npy", np.zeros(1000, dtype=np.float32))
    code, _, err = train(capsys, "--data", str(tmp_path / "f.npy"), "--steps", "1")
    assert code == 2 and "1-D integer array" in err


def test_missing_gpu_stack_is_one_line(monkeypatch, capsys):
    import slide.commands.train as train_cmd

    def no_torch(args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(train_cmd, "run", no_torch)
    code = main(["train"])
    assert code == 2 and "install the GPU stack" in capsys.readouterr().err


def test_compare_trace_of_a_prediction_and_a_cpu_run(tmp_path, tokens, capsys):
    measured, predicted = tmp_path / "measured.json", tmp_path / "predicted.json"
    assert train(capsys, "--data", tokens, "--steps", "3", "--save-trace", str(measured))[0] == 0
    assert main(["simulate", "--model", "tiny-llama", "--batch", "2", "--seq", "32", "--steps", "3",
                 "--save-trace", str(predicted)]) == 0  # fmt: skip
    capsys.readouterr()
    assert (
        main(["compare-trace", str(predicted), str(measured), "--gantt", str(tmp_path / "g.png")])
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "step_time_s" in out and "busy cpu" in out and (tmp_path / "g.png").stat().st_size > 10_000
    )
    assert main(["compare-trace", str(predicted), str(tmp_path / "nope.json")]) == 2


def test_the_summary_names_the_placement_and_its_prediction(tmp_path, tokens, capsys):
    """The summary says which placement ran; on CUDA also its predicted tokens/s and the step's
    error against it. In CPU mode the profile is a GPU preset's, so no prediction is claimed."""
    code, stdout, _ = train(capsys, "--data", tokens, "--steps", "2")
    summary = json.loads(stdout)
    assert code == 0 and "resident" in summary["placement"] and "kept tapes" in summary["placement"]
    assert "predicted_tokens_per_s" not in summary and "step_time_error" not in summary
    placed = {"chosen": "c", "predicted_step_s": 0.5, "tokens_per_step": 1000}
    got = against_plan(placed, 0.55, nproc=2)
    assert got == {"placement": "c", "predicted_tokens_per_s": 4000.0, "step_time_error": 0.1}
    assert against_plan(None, 0.55, nproc=1) == {}


def test_the_summary_sets_the_measured_memory_against_the_ledger(tmp_path, tokens, capsys):
    """Every run reports its host peak RSS; a run planned for its machine (CUDA, one process)
    also the GPU memory reserved, each against the ledger's peak for its tier, and says in one
    line when the host held more than 5% above the plan. In CPU mode nothing is set against a
    plan made for a GPU preset."""
    code, stdout, _ = train(capsys, "--data", tokens, "--steps", "2")
    memory = json.loads(stdout)["memory"]
    assert code == 0 and set(memory) == {"host_peak_rss_gib"}
    assert 0.1 < memory["host_peak_rss_gib"] <= peak_rss_bytes() / 2**30 + 0.001  # rounded
    host, gpu = 30 * 2**30, 5 * 2**30
    planned = {"cpu": host * 2, "gpu": 4 * 2**30, "nvme": 0}
    got = memory_summary({"planned_bytes": planned}, host, gpu)["memory"]
    assert got["gpu_peak_reserved_gib"] == 5.0 and got["gpu_vs_plan"] == 0.25
    assert got["host_vs_plan"] == -0.5 and "nvme_planned_gib" not in got
    assert memory_warning({"memory": got}) is None
    over = memory_summary({"planned_bytes": {**planned, "cpu": host // 2}}, host, gpu)
    assert "the host's peak RSS was 30.0 GiB, 100.0% above the 15.0 GiB" in (
        memory_warning(over) or ""
    )
    assert set(memory_summary(None, host, 0)["memory"]) == {"host_peak_rss_gib"}


def test_a_speculated_prediction_mixes_kept_and_rolled_back_steps_at_the_measured_share():
    """With speculated updates the run is set against the kept and the rolled-back step mixed
    at the share of its steady steps that rolled back, not at the plan's prior."""
    speculation = {"speculated_units": 4, "step_s": 1.0, "rollback_step_s": 2.0}
    placed = {"chosen": "c", "predicted_step_s": 1.25, "tokens_per_step": 1000,
              "speculation": speculation}  # fmt: skip
    assert against_plan(placed, 1.5, nproc=1, clipped=0.5)["step_time_error"] == 0.0
    assert against_plan(placed, 1.5, nproc=1, clipped=0.0)["step_time_error"] == 0.5
    assert (
        against_plan(placed, 1.5, nproc=1)["step_time_error"] == 0.2
    )  # no steady steps: the prior


@pytest.mark.parametrize(("norm", "clipped"), [("1e-9", 3), ("1e9", 0)])
def test_the_summary_counts_clipped_and_rolled_back_steps(tmp_path, tokens, capsys, norm, clipped):
    """Under global clipping with speculated updates the summary says how many steps clipped
    (each rolled its speculated updates back), and the metrics flag each step."""
    metrics = tmp_path / "m.jsonl"
    code, stdout, _ = train(capsys, "--data", tokens, "--steps", "3", "--clip", "global",
                            "--clip-norm", norm, "--placement", "small", "--speculate", "2",
                            "--metrics", str(metrics))  # fmt: skip
    assert code == 0
    assert json.loads(stdout)["clipping"] == {
        "steps": 3, "clipped_steps": clipped, "skipped_steps": 0, "speculated_units": 2,
        "rolled_back_steps": clipped,
    }  # fmt: skip
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert sum(r["clipped"] for r in rows if "clipped" in r) == clipped
    code, stdout, _ = train(capsys, "--data", tokens, "--steps", "2", "--clip", "per-unit")
    assert code == 0 and "clipping" not in json.loads(stdout)


@pytest.mark.parametrize(
    ("skipped", "ok"), [(None, True), ([], True), ([3], False), ([0], False), ("1", False)]
)
def test_resume_reads_the_skipped_steps_it_records(tmp_path, tokens, capsys, skipped, ok):
    """A state without `skipped_steps` (an older checkpoint's) resumes with none skipped; one
    naming a step it has not done, or not a list of steps, is refused in one line."""
    out = tmp_path / "run"
    assert train(capsys, "--data", tokens, "--steps", "3", "--save-every", "2", "--clip",
                 "global", "--out", str(out))[0] == 0  # fmt: skip
    ckpt = out / "checkpoints" / "step-000002" / "slide_state.json"
    state = json.loads(ckpt.read_text())
    assert state["skipped_steps"] == []
    if skipped is None:
        del state["skipped_steps"]
    else:
        state["skipped_steps"] = skipped
    ckpt.write_text(json.dumps(state))
    shutil.rmtree(out / "checkpoints" / "step-000003")
    (out / "latest").unlink()
    code, _, err = train(capsys, "--data", tokens, "--resume", str(out), "--out", str(out))
    if ok:
        assert code == 0
    else:
        assert code == 2 and "lacks a valid skipped_steps" in err, err
        assert len(err.strip().splitlines()) == 1
