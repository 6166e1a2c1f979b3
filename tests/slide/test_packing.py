"""`--packing documents` on the data side: the samples next fit cuts from a hand-made stream
(inputs, labels, positions checked token by token), the document starts a token cache records
for JSONL records, a text file and chat conversations, and batches of both packings."""

import json

import numpy as np
import pytest
import torch
from test_chat_data import CHAT, ID, build_tokenizer, write_chats

from slide.chat_data import LengthLimit
from slide.data import batches, load_token_stream, sample_count
from slide.errors import DataError
from slide.packing import IGNORE_INDEX as X
from slide.packing import PAD_ID as P
from slide.packing import document_sample, document_spans

# documents of 3, 2, 9 and 6 tokens (ids 100..119), samples of 6 tokens; token 115 untrained
IDS = np.arange(100, 120)
STARTS = np.array([0, 3, 5, 14])
PREDICT = np.arange(20) != 15
WANT = [
    # the first two documents and padding: no label across a boundary, the padding its own
    ((0, 5), [100, 101, 102, 103, 104, P], [101, 102, X, 104, X, X], [0, 1, 2, 0, 1, 0]),
    # the 9-token document in pieces: the first keeps its last label (the same document's)
    ((5, 11), [105, 106, 107, 108, 109, 110], [106, 107, 108, 109, 110, 111], list(range(6))),
    ((11, 14), [111, 112, 113, P, P, P], [112, 113, X, X, X, X], [0, 1, 2, 0, 1, 2]),
    # the last document: 115 is no target, the stream's last token has no label
    ((14, 20), [114, 115, 116, 117, 118, 119], [X, 116, 117, 118, 119, X], list(range(6))),
]


def test_next_fit_samples_of_a_hand_made_stream():
    spans = document_spans(STARTS, len(IDS), 6)
    assert spans.tolist() == [list(span) for span, *_ in WANT]
    for span, ids, labels, positions in WANT:
        got = document_sample(IDS, PREDICT, STARTS, span, 6)
        assert [g.tolist() for g in got] == [ids, labels, positions], span


def test_a_document_of_one_token_at_a_samples_end():
    starts = np.array([0, 5, 6])  # documents of 5, 1 and 2 tokens; samples of 6
    ids = np.arange(10, 18)
    spans = document_spans(starts, 8, 6)
    assert spans.tolist() == [[0, 6], [6, 8]]
    inputs, labels, positions = document_sample(ids, None, starts, (0, 6), 6)
    assert inputs.tolist() == list(range(10, 16))
    assert positions.tolist() == [0, 1, 2, 3, 4, 0]
    assert labels.tolist() == [11, 12, 13, 14, X, X]


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_a_cache_records_each_records_start(tmp_path, tokenizer_dir):
    data = _jsonl(tmp_path / "d.jsonl", ["one two three", "four", "five six seven eight"])
    stream = load_token_stream(data, tokenizer_dir=tokenizer_dir, cache_dir=tmp_path / "c")
    eos = np.flatnonzero(np.asarray(stream.ids) == 2)  # </s> ends every record
    assert stream.starts is not None
    assert stream.starts.tolist() == [0, *(eos[:-1] + 1).tolist()]


def test_a_text_file_is_one_document(tmp_path, tokenizer_dir):
    data = tmp_path / "d.txt"
    data.write_text("a line of text\n" * 50)
    stream = load_token_stream(data, tokenizer_dir=tokenizer_dir, cache_dir=tmp_path / "c")
    assert stream.starts is not None and stream.starts.tolist() == [0]
    # one document: samples of seq tokens, its pieces, the labels those of stream windows
    n = len(stream.ids)
    assert sample_count(stream, 32, "documents", "d.txt") == -(-n // 32)
    ids, labels, positions = next(batches(stream, batch=2, seq=32, count=1, shuffle=False,
                                          packing="documents"))  # fmt: skip
    window_ids, window_labels = next(batches(stream, batch=2, seq=32, count=1, shuffle=False))
    assert torch.equal(ids, window_ids) and torch.equal(labels, window_labels)
    assert torch.equal(positions, torch.arange(32).expand(2, 32))


def test_chat_batches_keep_conversations_apart(tmp_path):
    tok = build_tokenizer(tmp_path / "tok")
    short = CHAT[:3]  # system, user, assistant "hello": 12 tokens
    data = tmp_path / "chat.jsonl"
    write_chats(data, [CHAT, short, short, CHAT])
    limit = LengthLimit(24, "truncate")
    stream = load_token_stream(data, tokenizer_dir=tok, cache_dir=tmp_path / "c", limit=limit)
    assert stream.starts is not None and stream.starts.tolist() == [0, 20, 32, 44]
    ids, labels, positions = next(batches(stream, batch=3, seq=24, count=1, shuffle=False,
                                          packing="documents"))  # fmt: skip
    # the first conversation alone (the next does not fit), then the two short ones together
    assert positions[0].tolist() == [*range(20), 0, 1, 2, 3]
    assert positions[1].tolist() == [*range(12), *range(12)]
    assert ids[1, 12].item() == ID["<s>"] and labels[1, 11].item() == X
    # the assistant's words and end-of-turn are the only targets: "hello <|end|>" of each
    targets = [ID["hello"], ID["<|end|>"]]
    assert labels[1][labels[1] != X].tolist() == targets * 2
    assert (ids[0, 20:] == P).all() and (labels[0, 19:] == X).all()


def test_a_npy_has_no_documents(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.arange(100))
    stream = load_token_stream(path)
    with pytest.raises(DataError, match=r"t.npy is token ids with no document boundaries"):
        next(batches(stream, batch=1, seq=8, count=1, packing="documents", source=str(path)))


def test_too_few_samples_is_one_line(tmp_path, tokenizer_dir):
    data = _jsonl(tmp_path / "d.jsonl", ["one", "two"])
    stream = load_token_stream(data, tokenizer_dir=tokenizer_dir, cache_dir=tmp_path / "c")
    with pytest.raises(DataError, match=r"packs into 1 samples of 64 tokens .* batch of 2"):
        next(batches(stream, batch=2, seq=64, count=1, packing="documents", source="d.jsonl"))
