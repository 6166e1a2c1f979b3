"""Chat SFT data: a real tokenizer with a chat template built here (the `tokenizers` library,
saved as an HF tokenizer directory), its assistant mask checked token by token against a
hand-made example; the one-line errors; conversations longer than --seq truncated or dropped,
and counted; the token cache hit on a second load."""

import json
import logging

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from slide import token_cache
from slide.chat_data import LengthLimit
from slide.cli import main
from slide.data import load_token_stream
from slide.errors import DataError

# one token per word; the roles' markers and <|end|> are special tokens
WORDS = ["[UNK]", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>",
         "be", "brief", "hi", "there", "hello", "again", "bye", "now", "friend"]  # fmt: skip
TEMPLATE = (
    "<s>{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
ID = {w: i for i, w in enumerate(WORDS)}
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi there"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "bye now friend"},
]
# (token, target): the assistant's words and the <|end|> closing their turn are targets
WANT = [("<s>", 0), ("<|system|>", 0), ("be", 0), ("brief", 0), ("<|end|>", 0),
        ("<|user|>", 0), ("hi", 0), ("there", 0), ("<|end|>", 0),
        ("<|assistant|>", 0), ("hello", 1), ("<|end|>", 1),
        ("<|user|>", 0), ("again", 0), ("<|end|>", 0),
        ("<|assistant|>", 0), ("bye", 1), ("now", 1), ("friend", 1), ("<|end|>", 1)]  # fmt: skip


def build_tokenizer(directory, template=TEMPLATE):
    tok = Tokenizer(models.WordLevel(vocab=ID, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>",
                                   eos_token="<|end|>",
                                   additional_special_tokens=WORDS[3:6])  # fmt: skip
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("chat-tok"))


def write_chats(path, conversations):
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return path


def load(path, tokenizer, tmp_path, limit=None):
    return load_token_stream(path, tokenizer_dir=tokenizer, cache_dir=tmp_path / "cache",
                             limit=limit)  # fmt: skip


def test_the_assistant_turns_alone_are_targets(tmp_path, chat_tokenizer):
    stream = load(write_chats(tmp_path / "c.jsonl", [CHAT, CHAT[1:3]]), chat_tokenizer, tmp_path)
    second = [WANT[0], *WANT[5:12]]  # no system turn, one exchange
    want = WANT + second
    assert stream.ids.tolist() == [ID[w] for w, _ in want]
    assert stream.predict.tolist() == [bool(t) for _, t in want]
    assert stream.targets == sum(t for _, t in want)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], r"c.jsonl:1: an empty conversation"),
        ([{"role": "robot", "content": "hi"}], r"c.jsonl:1: message 1 has role 'robot'; known"),
        ([{"role": "user"}], r"c.jsonl:1: message 1 \(user\) has no content"),
        ([{"role": "user", "content": None}], r"message 1 \(user\) has no content"),
    ],
)
def test_bad_conversations_are_refused_by_record(tmp_path, chat_tokenizer, messages, message):
    path = write_chats(tmp_path / "c.jsonl", [messages])
    with pytest.raises(DataError, match=message):
        load(path, chat_tokenizer, tmp_path)


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path):
    plain = build_tokenizer(tmp_path / "plain", template=None)
    path = write_chats(tmp_path / "c.jsonl", [CHAT])
    with pytest.raises(DataError, match=r"c.jsonl:1: chat data, but the tokenizer .* has no chat"):
        load(path, plain, tmp_path)


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path):
    # the last turn alone is marked <|end|>: a prefix is not the start of the whole text
    odd = build_tokenizer(tmp_path / "odd", template=(
        "{% for m in messages %}{{ m['content'] }} {% if loop.last %}<|end|>{% endif %}"
        "{% endfor %}"))  # fmt: skip
    path = write_chats(tmp_path / "c.jsonl", [CHAT])
    with pytest.raises(DataError, match=r"c.jsonl:1: the chat template does not render"):
        load(path, odd, tmp_path)


def test_a_file_mixing_chat_and_text_records_is_refused(tmp_path, chat_tokenizer):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(DataError, match="mixes chat records"):
        load(path, chat_tokenizer, tmp_path)


def test_long_conversations_are_truncated_or_dropped_and_counted(tmp_path, chat_tokenizer,
                                                                 caplog):  # fmt: skip
    path = write_chats(tmp_path / "c.jsonl", [CHAT, CHAT[1:3], CHAT])  # 20, 8, 20 tokens
    with caplog.at_level(logging.WARNING):
        cut = load(path, chat_tokenizer, tmp_path, LengthLimit(12, "truncate"))
    assert "2 of 3 conversations truncated to --seq 12 tokens" in caplog.text
    first = [ID[w] for w, _ in WANT[:12]]
    assert cut.ids.tolist() == first + [ID[w] for w, _ in [WANT[0], *WANT[5:12]]] + first
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        dropped = load(path, chat_tokenizer, tmp_path, LengthLimit(12, "drop"))
    assert "2 of 3 conversations dropped: longer than --seq 12 tokens" in caplog.text
    assert len(dropped.ids) == 8 and dropped.cache != cut.cache
    with pytest.raises(DataError, match=r"holds no records \(3 conversations dropped"):
        load(path, chat_tokenizer, tmp_path, LengthLimit(4, "drop"))


def test_a_second_load_reads_the_cache_and_says_the_counts_again(
    tmp_path, chat_tokenizer, monkeypatch, caplog
):
    path = write_chats(tmp_path / "c.jsonl", [CHAT, CHAT])
    first = load(path, chat_tokenizer, tmp_path, LengthLimit(12, "truncate"))
    monkeypatch.setattr(token_cache, "_prepare", lambda *a: pytest.fail("tokenized again"))
    with caplog.at_level(logging.WARNING):
        again = load(path, chat_tokenizer, tmp_path, LengthLimit(12, "truncate"))
    assert again.cache == first.cache and again.predict.tolist() == first.predict.tolist()
    assert "2 of 2 conversations truncated" in caplog.text


def test_slide_data_tokenizes_chat_with_truncation(tmp_path, chat_tokenizer, capsys):
    path = write_chats(tmp_path / "c.jsonl", [CHAT] * 4)
    argv = ["data", "--data", str(path), "--tokenizer", str(chat_tokenizer), "--data-cache",
            str(tmp_path / "cache"), "--seq", "16", "--truncation", "drop", "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    assert "holds no records (4 conversations dropped" in capsys.readouterr().err
    assert main([*argv[:-2], "truncate", "--no-progress"]) == 0
    assert "tokens   64 (8 of them targets" in capsys.readouterr().out


def test_parquet_chat_records_read_through_datasets(tmp_path, chat_tokenizer):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("datasets")
    pq.write_table(pa.table({"messages": [CHAT, CHAT]}), tmp_path / "c.parquet")
    stream = load(tmp_path / "c.parquet", chat_tokenizer, tmp_path)
    assert stream.predict.tolist() == [bool(t) for _, t in WANT] * 2
