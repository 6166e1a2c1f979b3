"""`slide train --tensorboard DIR`: every number of each metrics line as a scalar at its step
(a fake SummaryWriter here, the real one where the tensorboard package is installed), and one
line before any work where the package is missing."""

import json
import sys
from typing import ClassVar

import pytest

from slide import tensorboard_scalars
from slide.cli import main

ARGV = ["train", "--device", "cpu", "--batch", "2", "--seq", "32", "--steps", "3", "--lr",
        "1e-3", "--no-progress"]  # fmt: skip


class FakeWriter:
    """What Scalars calls of a SummaryWriter, recorded."""

    made: ClassVar[list["FakeWriter"]] = []

    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.purge_step, self.scalars, self.closed = log_dir, purge_step, [], False
        FakeWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def metrics_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train_with_tensorboard(tmp_path, tokens, capsys):
    """A CPU run writing its metrics to m.jsonl and its scalars under tb/: the metrics' path."""
    metrics = tmp_path / "m.jsonl"
    argv = [
        *ARGV,
        "--data",
        tokens,
        "--metrics",
        str(metrics),
        "--tensorboard",
        str(tmp_path / "tb"),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    return metrics


def test_each_step_s_numbers_are_scalars(tmp_path, tokens, monkeypatch, capsys):
    monkeypatch.setattr(tensorboard_scalars, "summary_writer_class", lambda: FakeWriter)
    FakeWriter.made.clear()
    metrics = _train_with_tensorboard(tmp_path, tokens, capsys)
    (writer,) = FakeWriter.made
    assert writer.log_dir == str(tmp_path / "tb") and writer.purge_step is None and writer.closed
    for row in metrics_rows(metrics):
        got = {tag: value for tag, value, step in writer.scalars if step == row["step"]}
        assert got["train/loss"] == row["loss"] and got["train/lr"] == row["lr"]
        assert got["train/step_time_s"] == row["step_time_s"]
        assert got["train/tokens_per_s"] == row["tokens_per_s"]
        assert "train/config" not in got and "train/step" not in got


def test_a_missing_tensorboard_is_one_line_before_any_work(tmp_path, tokens, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    assert main([*ARGV, "--data", tokens, "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert err == ("slide train: error: --tensorboard needs the tensorboard package, which is "
                   "not installed here: pip install 'slide[tensorboard]'\n")  # fmt: skip
    assert not (tmp_path / "tb").exists()


def test_the_real_writer_writes_event_files(tmp_path, tokens, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics = _train_with_tensorboard(tmp_path, tokens, capsys)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert losses == [(r["step"], pytest.approx(r["loss"])) for r in metrics_rows(metrics)]
