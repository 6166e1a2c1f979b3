"""Checkpoints carry the tokenizer and generation_config.json: `AutoTokenizer.from_pretrained`
loads OUT and every checkpoint directory."""

import json
import shutil

from transformers import AutoTokenizer, GenerationConfig

from slide.cli import main

COMMON = ["train", "--device", "cpu", "--batch", "2", "--seq", "16", "--steps", "1",
          "--no-progress"]  # fmt: skip


def train(capsys, tmp_path, *argv):
    code = main([*COMMON, "--data-cache", str(tmp_path / "cache"), *argv])
    capsys.readouterr()
    assert code == 0


def encodes_like(directory, tokenizer_dir, text="the gpu moves the weights"):
    return AutoTokenizer.from_pretrained(str(directory)).encode(text) == (
        AutoTokenizer.from_pretrained(str(tokenizer_dir)).encode(text)
    )


def test_bundled_corpus_run_carries_the_tiny_tokenizer(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "out"
    train(capsys, tmp_path, "--out", str(out))
    (ckpt,) = (out / "checkpoints").iterdir()
    assert encodes_like(out, tokenizer_dir) and encodes_like(ckpt, tokenizer_dir)
    exported = json.loads((out / ".slide-run").read_text())["exported"]
    assert "tokenizer.json" in exported  # a later checkpoint replaces it like the weights


def test_model_directory_tokenizer_and_generation_config_travel(
    tmp_path, tokens, tokenizer_dir, capsys
):
    first = tmp_path / "first"
    train(capsys, tmp_path, "--out", str(first))
    model = tmp_path / "model"  # an HF model directory: OUT's exported files
    model.mkdir()
    for name in json.loads((first / ".slide-run").read_text())["exported"]:
        shutil.copy(first / name, model / name)
    (model / "generation_config.json").write_text(json.dumps({"max_new_tokens": 7}))
    out = tmp_path / "out"
    train(capsys, tmp_path, "--model", str(model), "--data", tokens, "--out", str(out))
    assert GenerationConfig.from_pretrained(str(out)).max_new_tokens == 7
    assert (out / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    assert encodes_like(out, tokenizer_dir)


def test_tokenizer_flag_wins_over_the_model_directory(tmp_path, tokens, tokenizer_dir, capsys):
    model = tmp_path / "model"
    train(capsys, tmp_path, "--out", str(model))
    other = tmp_path / "other"
    shutil.copytree(tokenizer_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 99}))
    out = tmp_path / "out"
    train(capsys, tmp_path, "--model", str(model), "--data", tokens, "--tokenizer", str(other),
          "--out", str(out))  # fmt: skip
    assert AutoTokenizer.from_pretrained(str(out)).model_max_length == 99


def test_token_ids_without_a_tokenizer_carry_none(tmp_path, tokens, capsys):
    out = tmp_path / "out"
    train(capsys, tmp_path, "--data", tokens, "--out", str(out))
    assert not (out / "tokenizer.json").exists()
