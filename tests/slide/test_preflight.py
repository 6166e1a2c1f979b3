"""Every option and output path checked before anything is planned: each bad one is refused in
one line naming the flag, the value and what would be valid, and no training starts (before
`slide.preflight`, these failed after the run, losing its summary, or as tracebacks)."""

import pytest

import slide.training
from slide.cli import main

COMMON = ["--device", "cpu", "--batch", "2", "--seq", "32", "--no-progress", "--steps", "3"]


@pytest.fixture
def no_training(monkeypatch):
    """A run that gets as far as planning fails the test: the checks come first."""

    def planned(*args, **kwargs):
        raise AssertionError("planned before the options were checked")

    monkeypatch.setattr(slide.training, "prepare", planned)


def refused(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--seq", "4096"], "--seq 4096 exceeds tiny-llama's context of 2048 tokens"),
        (["--warmup-steps", "50"], "--warmup-steps 50 exceeds the run's 3 steps"),
        (["--clip", "none", "--clip-norm", "0.5"], "--clip-norm 0.5 does nothing with --clip none"),
        (["--trace-steps", "100:200", "--gantt", "{tmp}/g.png"], "within 1:3"),
        (["--trace", "{tmp}/t.json", "--trace-steps", "2:4"], "past this run's 3 steps"),
        (["--gantt", "{tmp}/g.txt"], "cannot write a .txt file; end it in one of"),
        (["--gantt", "{tmp}/file/g.png"], "is a file, not a directory"),
        (["--metrics", "{tmp}"], "a directory; name a file"),
        (["--save-trace", "{tmp}"], "a directory; name a file"),
        (["--out", "{tmp}/file"], "is a file: name a directory"),
        (["--ram-gb", "inf"], "ram_gb must be a finite number of GiB > 0, got inf"),
        (
            ["--schedule", "zero-offload", "--resident", "3"],
            "--resident 3: only --schedule sliding places units",
        ),
        (
            ["--schedule", "gpu-only", "--optimizer", "nvme"],
            "--optimizer nvme: --schedule gpu-only keeps the optimizer",
        ),
    ],
)
def test_train_refuses_before_planning(tmp_path, capsys, no_training, argv, needle):
    (tmp_path / "file").write_text("not a directory")
    err = refused(capsys, "train", *COMMON, *(a.format(tmp=tmp_path) for a in argv))
    assert needle in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--model", "tiny-llama", "--out", "{tmp}"], "--out {tmp}: a directory"),
        (["plan", "--ram-gb", "inf"], "ram_gb must be a finite number"),
        (["plan", "--schedule", "gpu-only", "--cache-units", "4"], "--cache-units 4: only"),
        (["plan", "--schedule", "gpu-only", "--placement", "small"], "--placement small: only"),
        (["simulate", "--clip", "none", "--clip-norm", "2"], "--clip-norm 2.0 does nothing"),
        (["critical-batch", "--clip", "none", "--clip-norm", "2"], "--clip-norm 2.0 does nothing"),
        (["simulate", "--model", "tiny-llama", "--gantt", "{tmp}/g.doc"], "cannot write a .doc"),
        (["sweep", "--model", "tiny-llama", "--plot", "{tmp}"], "--plot {tmp}: a directory"),
        (["compare-trace", "a.json", "b.json", "--gantt", "{tmp}"], "--gantt {tmp}: a directory"),
    ],
)
def test_other_commands_check_their_outputs_first(tmp_path, capsys, argv, needle):
    err = refused(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert needle.format(tmp=tmp_path) in err


def test_a_bad_choice_lists_plain_strings(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--clip", "bogus"])
    err = capsys.readouterr().err
    assert "(choose from 'none', 'per-unit', 'global')" in err and "<Clip" not in err


def test_a_mistyped_flag_shows_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--bad-flag"])
    err = capsys.readouterr().err
    assert err.startswith("usage: slide train ") and "--resume" in err
    assert err.strip().endswith("slide train: error: unrecognized arguments: --bad-flag")


def test_outputs_may_go_to_new_directories(tmp_path, tokens, capsys):
    gantt, metrics = tmp_path / "a" / "g.png", tmp_path / "b" / "m.jsonl"
    code = main(["train", *COMMON, "--data", tokens, "--gantt", str(gantt), "--metrics",
                 str(metrics)])  # fmt: skip
    assert (
        code == 0 and gantt.stat().st_size > 10_000 and len(metrics.read_text().splitlines()) == 3
    )
