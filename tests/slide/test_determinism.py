"""CPU-mode `slide train` is bitwise reproducible: two real processes at different intra-op
thread counts (OMP_NUM_THREADS 1 and 2) write the same weights after 7 steps."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

ROOT = Path(__file__).parents[2]


def train(out, tokens, threads):
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "slide", "train", "--device", "cpu", "--steps", "7", "--data",
            tokens, "--lr", "1e-3", "--lr-schedule", "constant", "--no-progress", "--out", str(out)]  # fmt: skip
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=240, cwd=ROOT)
    return load_file(out / "model.safetensors")


@pytest.mark.timeout(600)
def test_weights_are_bitwise_equal_at_one_and_two_threads(tmp_path, tokens):
    one, two = train(tmp_path / "one", tokens, 1), train(tmp_path / "two", tokens, 2)
    assert one.keys() == two.keys()
    differ = [n for n in one if not one[n].equal(two[n])]
    assert not differ
