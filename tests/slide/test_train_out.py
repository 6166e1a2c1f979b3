"""`slide train --out` and `--resume`: what Slide refuses, keeps and deletes, and the resume rules."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from slide.cli import main

COMMON = ["--device", "cpu", "--batch", "2", "--seq", "32", "--lr", "1e-3", "--no-shuffle",
          "--no-progress"]  # fmt: skip


def train(capsys, tokens, *argv):
    code = main(["train", *COMMON, "--data", tokens, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_foreign_directory_is_refused_and_left_alone(tmp_path, tokens, capsys):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes")
    code, _, err = train(capsys, tokens, "--steps", "1", "--out", str(out))
    assert code == 2 and "--overwrite" in err and "notes.txt" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "sub"]
    code, _, _ = train(capsys, tokens, "--steps", "2", "--save-every", "1", "--keep", "1",
                       "--out", str(out), "--overwrite")  # fmt: skip
    assert code == 0
    assert (out / "notes.txt").read_text() == "my notes" and (out / "sub").is_dir()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000002"]


def test_out_naming_a_file_is_refused(tmp_path, tokens, capsys):
    file = tmp_path / "f.txt"
    file.write_text("keep me")
    code, _, err = train(capsys, tokens, "--steps", "1", "--out", str(file))
    assert code == 2 and "is a file" in err and file.read_text() == "keep me"


def test_a_second_run_needs_resume_or_overwrite(tmp_path, tokens, capsys):
    out = tmp_path / "run"
    assert train(capsys, tokens, "--steps", "2", "--out", str(out))[0] == 0
    code, _, err = train(capsys, tokens, "--steps", "2", "--out", str(out))
    assert code == 2 and f"--resume {out}" in err and "--overwrite" in err
    first = load_file(str(out / "model.safetensors"))
    code, _, _ = train(capsys, tokens, "--steps", "1", "--out", str(out), "--overwrite")
    assert code == 0  # the new run's step 1 replaces the old run's step 2
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000001"]
    assert not torch.equal(load_file(str(out / "model.safetensors"))["lm_head.weight"],
                           first["lm_head.weight"])  # fmt: skip


def test_resume_rules(tmp_path, tokens, capsys):
    out = tmp_path / "run"
    assert train(capsys, tokens, "--steps", "2", "--out", str(out))[0] == 0
    code, _, err = train(capsys, tokens, "--steps", "2", "--resume", str(out), "--out", str(out))
    assert code == 0 and "nothing to do" in err
    code, _, err = train(capsys, tokens, "--steps", "4", "--resume", str(out), "--out", str(out))
    assert code == 2 and "--extend-schedule" in err and "ends at step 2" in err
    code, _, err = train(capsys, tokens, "--steps", "2", "--resume", str(out), "--lr", "1e-2")
    assert code == 2 and "--lr 0.001" in err
    code, _, _ = train(capsys, tokens, "--steps", "4", "--resume", str(out), "--out", str(out),
                       "--extend-schedule")  # fmt: skip
    assert code == 0
    state = json.loads((out / "checkpoints" / "step-000004" / "slide_state.json").read_text())
    assert state["steps_done"] == 4 and state["total_steps"] == 4


def test_extended_schedule_follows_the_new_horizon(tmp_path, tokens, capsys):
    """Cosine over 4 steps, resumed to 6 with --extend-schedule: steps 3-6 use the 6-step curve."""
    out, metrics = tmp_path / "run", tmp_path / "m.jsonl"
    cosine = ["--lr-schedule", "cosine", "--metrics", str(metrics)]
    assert train(capsys, tokens, "--steps", "4", "--save-every", "2", "--out", str(out),
                 *cosine)[0] == 0  # fmt: skip
    (out / "latest").write_text("checkpoints/step-000002\n")
    code, _, _ = train(capsys, tokens, "--steps", "6", "--resume", str(out), "--out", str(out),
                       "--extend-schedule", *cosine)  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # steps 3-4 of the first run dropped
    lr = {r["step"]: r["lr"] for r in rows}
    expected = [1e-3 * 0.5 * (1 + np.cos(np.pi * (s - 1) / 6)) for s in range(3, 7)]
    np.testing.assert_allclose([lr[s] for s in range(3, 7)], expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--save-every", "-1"], "--save-every must be 0"),
        (["--keep", "0"], "--keep must be at least 1"),
        (["--model", "llama-3.1-405b"], "on --device cpu it needs"),
    ],
)
def test_bad_values_are_one_line(tmp_path, tokens, capsys, argv, needle):
    code, _, err = train(capsys, tokens, "--steps", "1", "--out", str(tmp_path / "o"), *argv)
    assert code == 2 and needle in err and len(err.splitlines()) == 1


def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path, tokens, capsys,
                                                               monkeypatch):  # fmt: skip
    import errno

    import slide.saving as saving

    out, writes = tmp_path / "run", []
    real = saving.write_safetensors

    def fill_up(path, tensors, **options):
        writes.append(path)
        if len(writes) > 1:  # the second checkpoint's optimizer file: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, tensors, **options)

    monkeypatch.setattr(saving, "write_safetensors", fill_up)
    code, _, err = train(capsys, tokens, "--steps", "4", "--save-every", "2", "--out", str(out))
    assert code == 1 and "No space left on device" in err and "step-000002" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
    assert (out / "latest").read_text().strip() == "checkpoints/step-000002"
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000002"]  # no partial


@pytest.mark.parametrize("room", [True, False], ids=["copy-then-write", "no-room-for-a-copy"])
def test_training_goes_on_while_a_checkpoint_is_written(tmp_path, tokens, capsys, monkeypatch,
                                                        caplog, room):  # fmt: skip
    """With room for a copy of the state, steps run while the checkpoint is written; without,
    training waits for the write. Either way both checkpoints are published, in order."""
    import threading
    import time

    import slide.saving as saving
    import slide.train_report as train_report

    writing, during = threading.Event(), []
    real_write, real_step = saving.write_text, train_report.Reporter.on_step

    def slow_write(path, text):
        writing.set()
        time.sleep(0.5)
        real_write(path, text)
        writing.clear()

    def on_step(self, *step):
        during.append(writing.is_set())
        real_step(self, *step)

    monkeypatch.setattr(saving, "write_text", slow_write)
    monkeypatch.setattr(train_report.Reporter, "on_step", on_step)
    if not room:
        monkeypatch.setattr(saving, "available_memory_bytes", lambda: 0)
    out = tmp_path / "run"
    code, _, _ = train(capsys, tokens, "--steps", "6", "--save-every", "2", "--out", str(out))
    assert code == 0
    assert any(during) is room, during
    said = [r.message for r in caplog.records if "does not fit" in r.message]
    assert len(said) == (0 if room else 1)  # the fallback is said once
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000004", "step-000006"]
