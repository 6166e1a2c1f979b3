"""The token cache: the old in-memory tokenization token for token, prepared once, never used
half-written (a real process killed mid-way), and host RSS flat in the data set's size."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from transformers import AutoTokenizer

from slide import data_formats, token_cache
from slide.cli import main
from slide.data import batches, load_token_stream
from slide.tokenizer import CORPUS, build_tiny_tokenizer

WORDS = CORPUS.read_text(encoding="utf-8").split()


@pytest.fixture(scope="module")
def bos_tokenizer_dir(tokenizer_dir, tmp_path_factory):
    """The tiny tokenizer made to put <s> before every encoding, as Llama's do."""
    from tokenizers import Tokenizer, processors

    out = tmp_path_factory.mktemp("bos")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((tokenizer_dir / name).read_bytes())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    tok.save(str(out / "tokenizer.json"))
    return out


@pytest.fixture(scope="module")
def spaces_tokenizer_dir(tmp_path_factory):
    """A BPE trained on `awkward_text`: it merges spaces and line breaks (ĠĊ, ĠĠĊ), so a chunk
    that ends at the wrong line break changes the tokens there."""
    corpus = awkward_text(tmp_path_factory.mktemp("spaces") / "corpus.txt")
    return build_tiny_tokenizer(corpus.parent / "tok", corpus=corpus, vocab_size=2000)


def reference(path, tokenizer_dir):
    """Slide's tokenization before the cache: the whole file, as Python lists."""
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    docs = []
    if path.suffix == ".jsonl":
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if "text" in row:
                docs.append((tok.encode(row["text"]), 0))
            else:
                prompt = tok.encode(row["prompt"])
                completion = tok.encode(row["completion"], add_special_tokens=False)
                docs.append((prompt + completion, len(prompt)))
    else:
        docs.append((tok.encode(path.read_text(encoding="utf-8")), 0))
    ids, predict = [], []
    for tokens, cut in docs:
        doc = [*tokens, tok.eos_token_id]
        ids += doc
        predict += [False] * cut + [True] * (len(doc) - cut)
    return ids, predict


def sentence(rng, k=12):
    return " ".join(rng.choices(WORDS, k=k))


def mixed_jsonl(path, rows=2500):
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            row = ({"text": sentence(rng)} if i % 3 else
                   {"prompt": sentence(rng, 5), "completion": " " + sentence(rng, 7)})  # fmt: skip
            f.write(json.dumps(row, ensure_ascii=False) + ("\n\n" if i % 50 == 0 else "\n"))
    return path


def awkward_text(path, lines=3000):
    """Line breaks of every kind: between words, before and after blanks, indents, spaces,
    tabs and non-ASCII letters (only some are places a chunk may end)."""
    rng = random.Random(1)
    shapes = ["{}", "{} ", "  {}", "", "\t{}", "ünïcödé {}", "{}.", "({})", "{}  "]
    text = "\n".join(rng.choice(shapes).format(sentence(rng, 6)) for _ in range(lines))
    path.write_text(text + "\n", encoding="utf-8")
    return path


def as_lists(stream):
    predict = [True] * len(stream.ids) if stream.predict is None else stream.predict.tolist()
    return stream.ids.tolist(), predict


@pytest.mark.parametrize(
    "tokenizer", ["tokenizer_dir", "bos_tokenizer_dir", "spaces_tokenizer_dir"]
)
def test_cache_equals_the_in_memory_tokenization(tmp_path, request, tokenizer, monkeypatch):
    tok = request.getfixturevalue(tokenizer)
    monkeypatch.setattr(data_formats, "BATCH_ROWS", 100)  # many batches
    monkeypatch.setattr(data_formats, "TEXT_CHUNK", 512)  # many chunks
    for path in (mixed_jsonl(tmp_path / "d.jsonl"), awkward_text(tmp_path / "t.txt")):
        stream = load_token_stream(path, tokenizer_dir=tok, cache_dir=tmp_path / "cache")
        ids, predict = reference(path, tok)
        got_ids, got_predict = as_lists(stream)
        assert got_ids == ids and got_predict == predict, path.name
        assert stream.ids.dtype == np.uint16 and stream.max_id == max(ids)
        assert stream.targets == sum(predict)
    chunks = list(data_formats.read_docs(tmp_path / "t.txt").batches)
    assert len(chunks) > 50  # the text was really cut


def test_a_second_load_reads_the_cache(tmp_path, tokenizer_dir, monkeypatch):
    path = mixed_jsonl(tmp_path / "d.jsonl", rows=300)
    first = load_token_stream(path, tokenizer_dir=tokenizer_dir, cache_dir=tmp_path)
    ids_file = first.cache / token_cache.IDS
    before = os.stat(ids_file)

    def no_tokenizing(_):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(token_cache, "load_tokenizer", no_tokenizing)
    again = load_token_stream(tmp_path / "d.jsonl", tokenizer_dir=tokenizer_dir, cache_dir=tmp_path)
    after = os.stat(ids_file)
    assert again.cache == first.cache and np.array_equal(again.ids, first.ids)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    path.write_text(path.read_text() + '{"text": "one more"}\n')  # new bytes: a new cache
    with pytest.raises(AssertionError, match="tokenized again"):
        load_token_stream(path, tokenizer_dir=tokenizer_dir, cache_dir=tmp_path)


def test_a_killed_preparation_is_never_used(tmp_path, tokenizer_dir):
    row = {"text": "the gpu moves the weights while the cpu updates them. " * 8}
    path = tmp_path / "big.jsonl"
    path.write_text((json.dumps(row) + "\n") * 40_000)  # 18 MB, several seconds to tokenize
    cache = tmp_path / "cache"
    code = (f"from slide.data import load_token_stream; load_token_stream({str(path)!r}, "
            f"tokenizer_dir={str(tokenizer_dir)!r}, cache_dir={str(cache)!r})")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 120
    while not any(f.stat().st_size for f in cache.glob(f".tmp-*/{token_cache.IDS}")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    left = list(cache.iterdir())
    assert [d.name.startswith(".tmp-") for d in left] == [True]  # nothing published

    stream = load_token_stream(path, tokenizer_dir=tokenizer_dir, cache_dir=cache)
    per_row = len(AutoTokenizer.from_pretrained(str(tokenizer_dir)).encode(row["text"])) + 1
    assert len(stream.ids) == 40_000 * per_row  # prepared whole, not from the partial files
    assert [d.name for d in cache.iterdir()] == [stream.cache.name]  # the dead one's removed


def test_resume_skips_batches_without_changing_them(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(5000) % 500)
    stream = load_token_stream(tmp_path / "t.npy")
    whole = list(batches(stream, batch=3, seq=16, count=12, seed=4))
    tail = list(batches(stream, batch=3, seq=16, count=12, start=7, seed=4))
    assert len(tail) == 5
    assert all((a == b).all() and (c == d).all()
               for (a, c), (b, d) in zip(whole[7:], tail, strict=True))  # fmt: skip


def test_shuffled_order_is_the_one_checkpoints_resume(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(16 * 40))
    stream = load_token_stream(tmp_path / "t.npy")
    got = [int(x[0, 0]) // 16 for x, _ in batches(stream, batch=1, seq=16, count=60, seed=9)]
    rng = np.random.default_rng(9)  # the order before the int32 draw, epoch after epoch
    assert got == [*rng.permutation(39).tolist(), *rng.permutation(39)[:21].tolist()]


def test_slide_data_prepares_and_counts(tmp_path, tokenizer_dir, capsys):
    path = mixed_jsonl(tmp_path / "d.jsonl", rows=200)
    argv = ["data", "--data", str(path), "--tokenizer", str(tokenizer_dir), "--data-cache",
            str(tmp_path / "cache"), "--seq", "16", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    ids, predict = reference(path, tokenizer_dir)
    assert f"tokens   {len(ids):,} ({sum(predict):,} of them targets" in out
    assert f"windows  {(len(ids) - 1) // 16:,} of 16 tokens" in out
    (cache,) = (tmp_path / "cache").iterdir()
    assert f"cache    {cache}" in out
    assert main(argv) == 0 and capsys.readouterr().out == out  # read from the cache
    assert main(["data", "--data", str(path)]) == 2
    assert "--tokenizer" in capsys.readouterr().err


def test_slide_train_prepares_the_cache_once(tmp_path, tokenizer_dir, capsys):
    path = mixed_jsonl(tmp_path / "d.jsonl", rows=200)
    cache = tmp_path / "cache"
    argv = ["train", "--device", "cpu", "--steps", "1", "--batch", "2", "--seq", "16",
            "--no-progress", "--data", str(path), "--tokenizer", str(tokenizer_dir),
            "--data-cache", str(cache)]  # fmt: skip
    assert main(argv) == 0
    (prepared,) = cache.iterdir()
    before = os.stat(prepared / token_cache.IDS)
    assert main(argv) == 0
    after = os.stat(prepared / token_cache.IDS)
    assert [d.name for d in cache.iterdir()] == [prepared.name]
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    capsys.readouterr()


RSS_PROBE = textwrap.dedent("""
    import sys
    from slide.data import batches, load_token_stream
    stream = load_token_stream(sys.argv[1], tokenizer_dir=sys.argv[2], cache_dir=sys.argv[3])
    for _ in batches(stream, batch=16, seq=128, count=stream.windows(128) // 16, seed=0):
        pass
    rss = next(l for l in open("/proc/self/status") if l.startswith("VmRSS:"))
    print(len(stream.ids) * stream.ids.itemsize, int(rss.split()[1]) * 1024)
""")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_host_rss_is_flat_in_the_data_size(tmp_path, tokenizer_dir):
    rng = random.Random(2)
    block = "".join(json.dumps({"text": sentence(rng, 40)}) + "\n" for _ in range(4000))
    figures = {}
    for name, megabytes in (("small", 10), ("big", 200)):
        path = tmp_path / f"{name}.jsonl"
        with path.open("w") as f:
            for _ in range(megabytes * 2**20 // len(block) + 1):
                f.write(block)
        load_token_stream(path, tokenizer_dir=tokenizer_dir, cache_dir=tmp_path / "cache")
        probe = [sys.executable, "-c", RSS_PROBE, str(path), str(tokenizer_dir),
                 str(tmp_path / "cache")]  # fmt: skip
        out = subprocess.run(probe, capture_output=True, text=True, check=True).stdout
        figures[name] = [int(x) for x in out.split()]
    (small_ids, small_rss), (big_ids, big_rss) = figures["small"], figures["big"]
    assert big_ids - small_ids > 64 * 2**20  # what the pages would add if they stayed mapped
    assert big_rss - small_rss < 24 * 2**20, figures
