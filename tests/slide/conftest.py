"""Fixtures the `slide train` tests share."""

import numpy as np
import pytest

from slide.tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """A 1-D token-id .npy file (20,000 ids below tiny-llama's vocab of 512)."""
    path = tmp_path_factory.mktemp("data") / "tokens.npy"
    np.save(path, np.random.default_rng(0).integers(0, 512, 20_000))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The built-in tiny tokenizer (byte-level BPE, vocab 512, EOS </s>, no BOS)."""
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
