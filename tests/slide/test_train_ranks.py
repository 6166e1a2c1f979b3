"""`slide train --nproc N` on the CPU (gloo): bad requests refused before any rank starts; two
ranks give the single process's checkpoint, resume as if never stopped (started by torchrun
itself), name a failing rank in one line, and stop together on Ctrl-C."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import slide.launch
from slide.cli import main

STEPS, BATCH, SEQ = 4, 2, 16
COMMON = ["--device", "cpu", "--batch", str(BATCH), "--seq", str(SEQ), "--lr", "1e-3", "--lr-schedule",
          "constant", "--no-shuffle", "--no-progress"]  # fmt: skip
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# a rank whose RANK is $FAIL_RANK gets 2 batches only: its data runs out at step 3
FAULT = """import itertools, os
if os.environ.get("RANK") == os.environ.get("FAIL_RANK"):
    import slide.train_prepare as t
    real = t.training_data
    def short(*a):
        data, eval_set = real(*a)
        return itertools.islice(data, 2), eval_set
    t.training_data = short
"""


def run_slide(*argv, env=None):
    """`python -m slide train ...` in a process of its own, as a user runs it."""
    cmd = [sys.executable, "-m", "slide", "train", *COMMON, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


# -- refused before anything starts ------------------------------------------------------------
@pytest.fixture
def no_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(slide.launch, "launch", lambda *a, **k: pytest.fail("launched"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc", "0"], "nproc must be a whole number from 1 to 8"),
        (["--nproc", "9"], "from 1 to 8 (one node's GPUs"),
        (
            ["--nproc", "3"],
            "batch 2 is the global batch, split over 3 ranks: it must be a multiple",
        ),
        (["--nproc", "2", "--schedule", "gpu-only"], "data parallel needs the sliding schedule"),
        (["--nproc", "2", "--data", "/nonexistent.npy"], "does not exist"),
    ],
)
def test_bad_requests_are_one_line_and_launch_nothing(no_launch, capsys, argv, message):
    code = main(["train", *COMMON, "--steps", "2", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_saved_plan_is_single_gpu(no_launch, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny-llama", "--batch", "2", "--seq", "16", "--out",
                 str(plan)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["train", "--device", "cpu", "--plan", str(plan), "--nproc", "2"]) == 2
    assert "--plan runs a single-GPU plan: drop --plan, or --nproc" in capsys.readouterr().err


def test_an_out_holding_other_files_is_refused_before_launching(no_launch, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    code = main(["train", *COMMON, "--steps", "2", "--nproc", "2", "--out", str(tmp_path)])
    assert code == 2 and "was not written by slide train" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_under_torchrun_nproc_must_be_its_world_size(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    code = main(["train", *COMMON, "--steps", "2", "--nproc", "3"])
    assert code == 2 and "--nproc 3, but torchrun started 2 ranks" in capsys.readouterr().err


# -- two ranks, end to end ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokens):
    """The same 4 steps in one process and on two ranks (saving every 2 steps)."""
    root = tmp_path_factory.mktemp("ranks")
    args = ["--data", tokens, "--steps", str(STEPS), "--save-every", "2"]
    one = run_slide(*args, "--out", str(root / "one"))
    assert one.returncode == 0, one.stderr
    started = time.perf_counter()
    two = run_slide(*args, "--out", str(root / "two"), "--nproc", "2",
                "--metrics", str(root / "m.jsonl"))  # fmt: skip
    print(f"2 ranks, {STEPS} steps: {time.perf_counter() - started:.1f} s")
    assert two.returncode == 0, two.stderr
    return root, two


def test_two_ranks_give_the_single_process_checkpoint(runs):
    from transformers import AutoModelForCausalLM

    root, two = runs
    # rank 1 prints nothing, rank 0 no progress bar (--no-progress), and once the start's notice
    notice = two.stderr.splitlines()
    assert len(notice) == 1 and "training starts from a random init" in notice[0]
    summary = json.loads(two.stdout)  # one summary: rank 0's
    assert summary["steps_done"] == STEPS and summary["nproc"] == 2
    rows = [json.loads(line) for line in (root / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # rank 0 alone writes them
    assert {r["tokens"] for r in rows} == {BATCH * SEQ}  # the global batch's, not a rank's
    a = AutoModelForCausalLM.from_pretrained(root / "one", dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(root / "two", dtype=torch.float32).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert (b[name] - a[name]).norm() <= 1e-5 * a[name].norm(), name


def test_two_rank_resume_under_torchrun_equals_an_uninterrupted_run(runs, tokens, tmp_path):
    root, _ = runs
    half, resumed = tmp_path / "half", tmp_path / "resumed"
    shutil.copytree(root / "two", half)
    shutil.rmtree(half / "checkpoints" / "step-000004")  # as if killed after step 2's save
    cmd = [*TORCHRUN, "-m", "slide", "train", *COMMON, "--data", tokens, "--steps", str(STEPS),
           "--resume", str(half), "--out", str(resumed)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps_done"] == STEPS
    final = "checkpoints/step-000004"
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(root / "two" / final / name), load_file(resumed / final / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_a_two_rank_checkpoint_resumes_in_one_process(runs, tokens, tmp_path):
    """Checkpoints hold the whole state by name, not shards: another rank count resumes them
    (here one process, which sums the same rows in one batch: equal within FP32 rounding)."""
    root, _ = runs
    step2 = root / "two" / "checkpoints" / "step-000002"
    done = run_slide("--data", tokens, "--steps", str(STEPS), "--resume", str(step2), "--out",
                     str(tmp_path / "one"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    final = "checkpoints/step-000004"
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(root / "two" / final / name), load_file(tmp_path / "one" / final / name)
        assert a.keys() == b.keys(), name
        for k in a:
            assert (b[k] - a[k]).norm() <= 1e-5 * a[k].norm() + 1e-12, (name, k)


@pytest.mark.parametrize("rank", [1, 0])
def test_a_failing_rank_is_named_in_one_line(tmp_path, tokens, rank):
    (tmp_path / "sitecustomize.py").write_text(FAULT)
    env = os.environ | {"PYTHONPATH": str(tmp_path), "FAIL_RANK": str(rank)}
    done = run_slide("--data", tokens, "--steps", str(STEPS), "--nproc", "2", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    own = (f"slide train: rank {rank}: error: the data ran out at step 3, micro-batch 0 "
           "(each step takes 1 micro-batches of (2, 16))")  # fmt: skip
    lines = [x for x in done.stderr.strip().splitlines() if not x.startswith("WARNING ")]
    assert own in lines
    # the other rank, unless the agent stopped it first, names the one that failed
    others = [x for x in lines if x != own]
    assert all(x.startswith(f"slide train: rank {1 - rank}: error: rank {rank} failed: "
                            "DataError: the data ran out") for x in others), others  # fmt: skip


def test_a_rank_killed_without_a_word_is_named_by_the_launcher(tmp_path, tokens):
    metrics = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "slide", "train", *COMMON, "--data", tokens, "--steps", "1000",
           "--nproc", "2", "--metrics", str(metrics)]  # fmt: skip
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for_steps(metrics, 1)
    ranks = subprocess.run(["ps", "-o", "pid=", "--ppid", str(launcher.pid)],
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    (rank_1,) = [int(pid) for pid in ranks if b"\0RANK=1\0" in _environ(pid)]
    os.kill(rank_1, signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGKILL
    assert stderr.strip().splitlines()[-1] == "slide train: rank 1: killed by SIGKILL"


def test_ctrl_c_stops_every_rank_and_rank_0_saves(tmp_path, tokens):
    out, metrics = tmp_path / "out", tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "slide", "train", *COMMON, "--data", tokens, "--steps", "1000",
           "--nproc", "2", "--out", str(out), "--metrics", str(metrics)]  # fmt: skip
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # after step 2 every rank has done step 1: a Ctrl-C now stops after a step (earlier, aborts)
    _wait_for_steps(metrics, 2)
    launcher.send_signal(signal.SIGINT)
    stdout, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, stderr
    steps = json.loads(stdout)["steps_done"]
    assert 1 <= steps < 1000
    assert stderr.strip().splitlines()[-1] == (
        f"slide train: interrupted after step {steps}: checkpoint "
        f"{out / 'checkpoints' / f'step-{steps:06d}'}; continue with --resume {out}"
    )
    assert (out / "latest").read_text().strip() == f"checkpoints/step-{steps:06d}"
    assert len(_lines(metrics)) == steps
    assert not list((out / "checkpoints").glob(".tmp-*"))


def _lines(path):
    return path.read_text().splitlines() if path.is_file() else []


def _wait_for_steps(metrics, steps):
    deadline = time.monotonic() + 60
    while len(_lines(metrics)) < steps and time.monotonic() < deadline:
        time.sleep(0.05)


def _environ(pid):
    return b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
