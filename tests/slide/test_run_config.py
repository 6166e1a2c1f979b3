"""`slide train --config run.toml`: keys as the flags, typed flags win, unknown keys refused
naming the closest, values parsed as the flags parse them; the resolved flags written to
OUT/config.toml and the first metrics line; a run from that file repeats the first bitwise."""

import argparse
import json
import tomllib

import pytest

from slide.cli import main
from slide.commands import train
from slide.run_config import read_config, to_toml


def read(tmp_path, text):
    (tmp_path / "run.toml").write_text(text)
    return read_config(str(tmp_path / "run.toml"), train.add_arguments)


def test_keys_are_the_flags_with_dashes_or_underscores(tmp_path):
    values = read(tmp_path, 'seq = 64\nlr_schedule = "linear"\nwarmup-steps = 2\nlr = 3e-4\n'
                  'no-shuffle = true\nnvme-dir = ["/a", "/b"]\nbetas = "0.8,0.9"\n')  # fmt: skip
    assert values == {"seq": 64, "lr_schedule": "linear", "warmup_steps": 2, "lr": 3e-4,
                      "no_shuffle": True, "nvme_dir": ["/a", "/b"], "betas": "0.8,0.9"}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sequence = 64\n", "unknown key 'sequence': did you mean 'seq'?"),
        ("lr_shedule = 'linear'\n", "unknown key 'lr_shedule': did you mean 'lr-schedule'?"),
        ("zzz = 1\n", "unknown key 'zzz' (its keys are the command's flags)"),
        ("config = 'x.toml'\n", "unknown key 'config'"),
        ("seq = 'long'\n", "argument --seq: invalid int value: 'long'"),
        ("lr-schedule = 'bogus'\n", "argument --lr-schedule: invalid choice: 'bogus'"),
        ("no-shuffle = 1\n", "no-shuffle is a switch: give true or false"),
        ("seq = [1, 2]\n", "seq takes one value"),
        ("seq = \n", "not TOML"),
    ],
)
def test_bad_files_are_one_line(tmp_path, capsys, text, message):
    (tmp_path / "run.toml").write_text(text)
    assert main(["train", "--config", str(tmp_path / "run.toml")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_typed_flags_override_the_file_and_count_as_given(tmp_path, monkeypatch):
    (tmp_path / "run.toml").write_text("seq = 64\nbatch = 3\nno-shuffle = true\n")
    seen = {}

    def fake_run(args: argparse.Namespace) -> int:
        seen.update(seq=args.seq, batch=args.batch, no_shuffle=args.no_shuffle, given=args.given)
        return 0

    monkeypatch.setattr(train, "run", fake_run)
    assert main(["train", "--config", str(tmp_path / "run.toml"), "--seq", "32"]) == 0
    assert (seen["seq"], seen["batch"], seen["no_shuffle"]) == (32, 3, True)
    assert {"seq", "batch", "no_shuffle", "config"} <= seen["given"]


def test_written_toml_reads_back_as_written():
    values = {"model": 'tiny "llama"\\x', "seq": 32, "lr": 1e-05, "clip-norm": 1.0,
              "no-shuffle": False, "nvme-dir": ["/a", "/b"], "reduce-bucket": 5e8}  # fmt: skip
    assert tomllib.loads(to_toml(values)) == values


def test_a_run_from_its_config_toml_repeats_it_bitwise(tmp_path, tokens, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    argv = ["train", "--device", "cpu", "--data", tokens, "--batch", "2", "--seq", "32",
            "--steps", "3", "--lr", "1e-3", "--no-progress"]  # fmt: skip
    assert main([*argv, "--out", str(first), "--metrics", str(tmp_path / "m1.jsonl")]) == 0
    config = tomllib.loads((first / "config.toml").read_text())
    assert config["seq"] == 32 and config["lr"] == 1e-3 and config["out"] == str(first)
    rows = [json.loads(line) for line in (tmp_path / "m1.jsonl").read_text().splitlines()]
    assert rows[0]["config"] == config and "config" not in rows[1]
    assert main(["train", "--config", str(first / "config.toml"), "--out", str(second),
                 "--metrics", str(tmp_path / "m2.jsonl")]) == 0  # fmt: skip
    again = [json.loads(line) for line in (tmp_path / "m2.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in again] == [r["loss"] for r in rows]
    repeated = tomllib.loads((second / "config.toml").read_text())
    assert repeated == {**config, "out": str(second), "metrics": str(tmp_path / "m2.jsonl")}
    capsys.readouterr()
