"""`--packing` on the command line: parsed and validated (one line for a bad value or a .npy
beside `documents`), carried by `--config` files and OUT/config.toml, recorded in checkpoints
so `--resume` continues with it; chat SFT data trained packed on the CPU, and `slide data`
counting the samples."""

import json
import shutil
import tomllib

import pytest
import torch
from safetensors.torch import load_file
from test_chat_data import CHAT, build_tokenizer, write_chats

from slide.cli import main

COMMON = ["--device", "cpu", "--batch", "2", "--seq", "32", "--lr", "1e-3", "--lr-schedule",
          "constant", "--no-progress"]  # fmt: skip


def _train(capsys, *argv):
    code = main(["train", *COMMON, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_bad_packing_is_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as stop:  # argparse's usage and one error line
        main(["train", "--packing", "bogus"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert "--packing: invalid choice: 'bogus' (choose from 'stream', 'documents')" in err


def test_documents_beside_token_ids_is_one_line(capsys, tokens):
    code, _, err = _train(capsys, "--packing", "documents", "--data", tokens, "--steps", "1")
    assert code == 2 and err.count("\n") == 1
    assert f"--packing documents: --data {tokens} is token ids with no document" in err


def _chats(tmp_path):
    data = tmp_path / "chat.jsonl"
    write_chats(data, [CHAT, CHAT[:3]] * 12)
    return data, build_tokenizer(tmp_path / "tok")


def test_chat_data_packed_from_a_config_file_and_resumed(tmp_path, capsys):
    data, tok = _chats(tmp_path)
    (tmp_path / "run.toml").write_text(f'packing = "documents"\ndata = "{data}"\n'
                                       f'tokenizer = "{tok}"\nsteps = 4\n')  # fmt: skip
    config = ["--config", str(tmp_path / "run.toml"), "--data-cache", str(tmp_path / "c")]
    whole, half, resumed = tmp_path / "whole", tmp_path / "half", tmp_path / "resumed"
    assert _train(capsys, *config, "--out", str(whole))[0] == 0
    written = tomllib.loads((whole / "config.toml").read_text())
    assert written["packing"] == "documents"
    state = json.loads((whole / "checkpoints" / "step-000004" / "slide_state.json").read_text())
    assert state["packing"] == "documents"
    assert _train(capsys, *config, "--out", str(half), "--save-every", "2")[0] == 0
    shutil.rmtree(half / "checkpoints" / "step-000004")
    # no --packing: the checkpoint's is taken, and the run goes on as if never stopped
    code, _, _ = _train(capsys, "--resume", str(half), "--out", str(resumed),
                        "--data-cache", str(tmp_path / "c"))  # fmt: skip
    assert code == 0
    assert tomllib.loads((resumed / "config.toml").read_text())["packing"] == "documents"
    a, b = (load_file(str(d / "model.safetensors")) for d in (whole, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the same data as one stream trains other weights
    stream = tmp_path / "stream"
    assert _train(capsys, *config, "--packing", "stream", "--out", str(stream))[0] == 0
    c = load_file(str(stream / "model.safetensors"))
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_slide_data_counts_the_packed_samples(tmp_path, capsys):
    data, tok = _chats(tmp_path)
    argv = ["data", "--data", str(data), "--tokenizer", str(tok), "--seq", "32",
            "--data-cache", str(tmp_path / "c"), "--no-progress"]  # fmt: skip
    assert main([*argv, "--packing", "documents"]) == 0
    # 12 pairs of conversations of 20 and 12 tokens: one pair a sample
    assert "windows  12 of 32 tokens (--seq 32, --packing documents)" in capsys.readouterr().out
    assert main(argv) == 0
    assert "windows  11 of 32 tokens (--seq 32, --packing stream)" in capsys.readouterr().out


def test_packed_documents_are_planned_with_the_masked_attention():
    """`--packing documents` reaches the planner: its layers' attention is priced masked."""
    from slide.cli import build_parser
    from slide.commands import train

    for packing, masked in (("documents", True), ("stream", False)):
        args = build_parser().parse_args(["train", *COMMON, "--packing", packing])
        assert train._request(args, [], {}).config.document_mask is masked
