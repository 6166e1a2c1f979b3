"""`slide train --eval-data / --eval-fraction`: the eval loss of a real HF checkpoint trained on
the CPU equals transformers' forward of the checkpoint it wrote on the same eval batches;
held-out windows are never trained on; bad values are one line; `--config` carries the keys."""

import json

import numpy as np
import pytest
import torch

from bench.kernels.gpu_parity import random_model
from slide.cli import main
from slide.data import TokenStream, batches
from slide.eval_data import EvalSet, held_out, training_windows

B, S = 2, 32
COMMON = ["--device", "cpu", "--batch", str(B), "--seq", str(S), "--lr", "1e-3", "--lr-schedule",
          "constant", "--no-progress", "--seed", "3"]  # fmt: skip
CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, "rope_theta": 10000.0}  # fmt: skip
RTOL = 2e-5  # the executor's CPU parity with transformers (tests/executor/runs.py), twice


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny llama from its HF config, saved as config.json + model.safetensors."""
    path = tmp_path_factory.mktemp("model")
    random_model(CONFIG).save_pretrained(path)
    return str(path)


def train(capsys, *argv):
    code = main(["train", *COMMON, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def transformers_eval_loss(model_path, eval_set: EvalSet, count: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for ids, labels in eval_set.iterate(count):
            logits = model(input_ids=ids).logits.flatten(0, 1)  # (B*S, V)
            total += float(
                torch.nn.functional.cross_entropy(logits, labels.flatten(), reduction="sum")
            )
            tokens += int((labels != -100).sum())
    return total / tokens


def test_held_out_eval_loss_is_transformers_on_the_checkpoint(tmp_path, tokens, model_dir, capsys):
    out, metrics = tmp_path / "out", tmp_path / "m.jsonl"
    code, stdout, _ = train(capsys, "--model", model_dir, "--data", tokens, "--steps", "4",
                            "--eval-fraction", "0.01", "--eval-every", "3", "--eval-batches", "0",
                            "--out", str(out), "--metrics", str(metrics))  # fmt: skip
    assert code == 0
    evals = [r for r in rows_of(metrics) if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 4]  # every 3rd step, and the last
    stream = TokenStream(ids=np.load(tokens), predict=None, max_id=511, targets=0)
    windows = stream.windows(S)
    eval_set = EvalSet.of(stream, held_out(windows, 0.01, 3, batch=B), batch=B, seq=S,
                          vocab_size=512, source="tokens")  # fmt: skip
    count = eval_set.batches(0)
    assert (
        evals[-1]["eval_batches"] == count and evals[-1]["eval_tokens"] == len(eval_set.samples) * S
    )
    want = transformers_eval_loss(out, eval_set, count)
    assert abs(evals[-1]["eval_loss"] - want) <= RTOL * want
    summary = json.loads(stdout)
    assert summary["eval_loss"] == evals[-1]["eval_loss"] and summary["evals"] == 2


def test_eval_data_file_with_the_config_file_keys(tmp_path, tokens, model_dir, capsys):
    eval_file = tmp_path / "eval.npy"
    np.save(eval_file, np.random.default_rng(7).integers(0, 512, 5 * S + 1))
    config = tmp_path / "run.toml"
    config.write_text(f'eval-data = "{eval_file}"\neval-every = 1\neval-batches = 2\n')
    out, metrics = tmp_path / "out", tmp_path / "m.jsonl"
    code, _, _ = train(capsys, "--config", str(config), "--model", model_dir, "--data", tokens,
                       "--steps", "2", "--out", str(out), "--metrics", str(metrics))  # fmt: skip
    assert code == 0
    evals = [r for r in rows_of(metrics) if "eval_loss" in r]
    assert [(r["step"], r["eval_batches"]) for r in evals] == [(1, 2), (2, 2)]
    written = (out / "config.toml").read_text()
    assert "eval-every = 1" in written and "eval-batches = 2" in written
    stream = TokenStream(ids=np.load(eval_file), predict=None, max_id=511, targets=0)
    eval_set = EvalSet.of(stream, None, batch=B, seq=S, vocab_size=512, source="eval")
    want = transformers_eval_loss(out, eval_set, 2)
    assert abs(evals[-1]["eval_loss"] - want) <= RTOL * want


def test_training_never_draws_a_held_out_window():
    ids = np.arange(40 * S + 1)  # every window's first token tells the window
    stream = TokenStream(ids=ids, predict=None, max_id=int(ids.max()), targets=len(ids))
    held = held_out(40, 0.25, seed=5, batch=B)
    assert len(held) == 10 and np.array_equal(held, held_out(40, 0.25, seed=5, batch=B))
    assert not np.array_equal(held, held_out(40, 0.25, seed=6, batch=B))
    trained = set()
    for x, _ in batches(stream, batch=B, seq=S, count=100, samples=training_windows(40, held)):
        trained |= {int(t) // S for t in x[:, 0]}
    assert trained == set(range(40)) - {int(w) for w in held}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--eval-fraction", "0"], "--eval-fraction must be between 0 and 1 (exclusive), got 0.0"),
        (["--eval-fraction", "1.5"], "--eval-fraction must be between 0 and 1"),
        (["--eval-data", "x.npy", "--eval-fraction", "0.1"], "give one eval set"),
        (["--eval-fraction", "0.1", "--eval-every", "0"], "--eval-every must be a step count >= 1"),
        (
            ["--eval-data", "/nonexistent/eval.jsonl"],
            "--eval-data /nonexistent/eval.jsonl: no such file",
        ),
        (["--eval-every", "2"], "--eval-every does nothing without an eval set"),
        (["--eval-fraction", "0.1", "--eval-batches", "-1"], "--eval-batches must be"),
        (["--eval-fraction", "0.00001"], "holds out none"),
    ],
)
def test_bad_eval_values_are_one_line(tokens, capsys, argv, needle):
    code, _, err = train(capsys, "--data", tokens, "--steps", "1", *argv)
    assert code == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
