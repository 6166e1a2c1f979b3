"""Token windows from .npy, JSONL and text; bad data refused with the file named."""

import json

import numpy as np
import pytest
import torch

from slide.data import IGNORE_INDEX, batches, load_token_stream
from slide.errors import DataError


def test_npy_windows_are_consecutive_slices(tmp_path):
    ids = np.arange(1000, dtype=np.int32)
    np.save(tmp_path / "t.npy", ids)
    stream = load_token_stream(tmp_path / "t.npy")
    got = list(batches(stream, batch=2, seq=8, count=3, shuffle=False))
    x, y = got[0]
    assert x.dtype == torch.int64 and x.shape == (2, 8)
    assert x[0].tolist() == list(range(0, 8)) and y[0].tolist() == list(range(1, 9))
    assert x[1].tolist() == list(range(8, 16))  # sample i = tokens[i*S : i*S+S+1]
    assert got[2][0][1].tolist() == list(range(40, 48))


def test_shuffle_is_seeded(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(4000))
    stream = load_token_stream(tmp_path / "t.npy")
    a = [x for x, _ in batches(stream, batch=4, seq=16, count=5, seed=1)]
    b = [x for x, _ in batches(stream, batch=4, seq=16, count=5, seed=1)]
    c = [x for x, _ in batches(stream, batch=4, seq=16, count=5, seed=2)]
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a, c, strict=True))


def test_jsonl_masks_prompt_tokens(tmp_path, tokenizer_dir):
    rows = [{"prompt": "the gpu moves", "completion": " the weights."}] * 50
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    stream = load_token_stream(
        tmp_path / "d.jsonl", tokenizer_dir=tokenizer_dir, cache_dir=tmp_path
    )
    assert 0 < stream.predict.mean() < 1
    _, labels = next(batches(stream, batch=1, seq=32, count=1, shuffle=False))
    assert (labels == IGNORE_INDEX).any() and (labels != IGNORE_INDEX).any()


def test_text_file_round_trips_through_the_tokenizer(tmp_path, tokenizer_dir):
    (tmp_path / "c.txt").write_text("the cpu updates the weights. " * 200)
    stream = load_token_stream(tmp_path / "c.txt", tokenizer_dir=tokenizer_dir, cache_dir=tmp_path)
    assert stream.predict is None and stream.max_id < 512


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.npy", None, "does not exist"),
        ("empty.jsonl", "", "is empty"),
        ("bad.jsonl", "{not json\n", "bad.jsonl:1: not JSON"),
        ("shape.jsonl", '{"title": "x"}\n', 'expected {"text"}, {"prompt"'),
        ("chat.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n', "chat template"),
        ("broken.json", '[{"text": 1', "not readable as json"),
        ("nothing.jsonl", "\n\n", "holds no records"),
        ("not.parquet", "plain words", "not readable as parquet"),
    ],
)
def test_bad_files_are_refused(tmp_path, tokenizer_dir, name, content, message):
    if content is not None:
        (tmp_path / name).write_text(content)
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=message.replace("{", r"\{").replace("(", r"\(")):
        load_token_stream(tmp_path / name, tokenizer_dir=tokenizer_dir, cache_dir=cache)
    assert not list(cache.glob("*")) and not list(cache.glob(".*"))  # no cache, no temporary


def test_float_npy_and_short_data_are_refused(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(10, dtype=np.float32))
    with pytest.raises(DataError, match="1-D integer array"):
        load_token_stream(tmp_path / "f.npy")
    np.save(tmp_path / "s.npy", np.arange(20))
    stream = load_token_stream(tmp_path / "s.npy")
    with pytest.raises(DataError, match="one batch of 4 x 8 needs 33"):
        next(batches(stream, batch=4, seq=8, count=1))
    with pytest.raises(DataError, match="vocab_size 10"):
        next(batches(stream, batch=1, seq=8, count=1, vocab_size=10))
