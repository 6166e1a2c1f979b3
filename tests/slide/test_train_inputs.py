"""Where `slide train` takes a value whose flag is left out: a saved plan's steps, a resumed
checkpoint's hyperparameters and inputs; and what it says before a run starts (a random init,
a run whose model is not saved). A flag's default never overrides either; a flag given does."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from slide.cli import main

# a run with nothing at its default: a resume must take all of it from the checkpoint
RUN = ["--device", "cpu", "--batch", "2", "--seq", "32", "--grad-accum", "2", "--lr", "3e-3",
       "--lr-schedule", "linear", "--warmup-steps", "1", "--weight-decay", "0.1", "--betas",
       "0.8,0.99", "--eps", "1e-6", "--seed", "7", "--no-shuffle", "--clip", "per-unit",
       "--clip-norm", "0.5", "--steps", "4"]  # fmt: skip
QUIET = ["--no-progress"]


def train(capsys, *argv):
    code = main(["train", *QUIET, *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def halfway(tmp_path_factory, tokens):
    """The 4-step run's final weights, and a copy of the run as if killed after step 2."""
    root = tmp_path_factory.mktemp("run")
    assert main(["train", *QUIET, *RUN, "--data", tokens, "--save-every", "2", "--out",
                 str(root / "whole")]) == 0  # fmt: skip
    shutil.copytree(root / "whole", root / "half")
    shutil.rmtree(root / "half" / "checkpoints" / "step-000004")
    return load_file(str(root / "whole" / "model.safetensors")), root / "half"


def test_a_resume_takes_the_checkpoints_values(halfway, tmp_path, capsys, caplog):
    final, half = halfway
    code, out, err = train(capsys, "--device", "cpu", "--resume", str(half), "--out",
                           str(tmp_path / "resumed"))  # fmt: skip
    assert code == 0 and json.loads(out)["steps_done"] == 4, err
    resumed = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert all(torch.equal(final[k], resumed[k]) for k in final)
    assert "random init" not in caplog.text  # a resume continues trained weights


def test_a_resume_refuses_a_flag_given_otherwise(halfway, capsys):
    code, _, err = train(capsys, "--device", "cpu", "--resume", str(halfway[1]), "--lr", "1e-2")
    assert code == 2 and "trained with --lr 0.003; leave --lr out to continue with it" in err


def test_a_resume_on_other_data_is_said(halfway, tmp_path, capsys, caplog):
    import numpy as np

    other = tmp_path / "other.npy"
    np.save(other, np.arange(20_000) % 512)
    code, _, _ = train(capsys, "--device", "cpu", "--resume", str(halfway[1]), "--data",
                         str(other))  # fmt: skip
    assert code == 0 and f"--data {other} is not the data" in caplog.text


def test_a_saved_plan_carries_its_steps_and_fixes_the_rest(tmp_path, tokens, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", "tiny-llama", "--batch", "2", "--seq", "32", "--steps", "5",
                 "--out", str(plan)]) == 0  # fmt: skip
    capsys.readouterr()
    run = ["--device", "cpu", "--data", tokens, "--plan", str(plan)]
    code, out, _ = train(capsys, *run)
    assert code == 0 and json.loads(out)["steps_done"] == 5
    code, out, _ = train(capsys, *run, "--steps", "2")
    assert code == 0 and json.loads(out)["steps_done"] == 2
    code, _, err = train(capsys, *run, "--batch", "4", "--model", "qwen2.5-0.5b")
    assert code == 2 and f"--plan {plan} fixes the model" in err and "drop --batch, --model" in err


def test_the_start_says_what_would_go_unsaid(tmp_path, tokens):
    """A real process: the notices on its stderr, once each, after the checks passed."""
    run = [sys.executable, "-m", "slide", "train", *QUIET, "--device", "cpu", "--data", tokens,
           "--steps", "1", "--batch", "2", "--seq", "32"]  # fmt: skip
    err = subprocess.run(run, capture_output=True, text=True, check=True).stderr
    random_init = ("tiny-llama is an architecture from the catalog, without weights: training "
                   "starts from a random init (--seed 0)")  # fmt: skip
    assert err.count(random_init) == 1 and "--model DIR" in err
    assert err.count("no --out: the trained model will not be saved") == 1
    out = tmp_path / "run"
    err = subprocess.run([*run, "--out", str(out)], capture_output=True, text=True,
                         check=True).stderr  # fmt: skip
    assert random_init in err and "no --out" not in err
    model = [*run, "--model", str(out)]  # the run's checkpoint: weights to load
    err = subprocess.run(model, capture_output=True, text=True, check=True).stderr
    assert "random init" not in err
    refused = subprocess.run([*run, "--warmup-steps", "9"], capture_output=True, text=True)
    assert refused.returncode == 2 and "random init" not in refused.stderr  # checks first
