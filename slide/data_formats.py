"""The user's data file as a stream of documents, in batches: never the whole file at once (but
a JSON array, which any JSON parser reads whole: for big data use JSONL or parquet).

By suffix: `.jsonl` (one record per line, read here: errors name the line); `.json` (an array
of records, or JSON lines), `.parquet`, `.arrow` and `.csv` (through the `datasets` library,
streamed); anything else is UTF-8 text, cut into chunks at line breaks. A record is
{"text"}, {"prompt", "completion"}, Alpaca's {"instruction", "input", "output"} (its prompt
the Alpaca template), or chat's {"messages": [{"role", "content"}, ...]} (rendered by the
tokenizer's chat template, `slide.chat_data`); prompt tokens are not targets, nor are a
conversation's turns but the assistant's. A UTF-8 BOM is skipped; bytes that are not
UTF-8 are refused naming the file and the byte offset.

A text file's chunks end at a line break between two visible ASCII characters: byte-level
pre-tokenizers (GPT-2's, Llama 3's) split there anyway, so the chunks' tokens are the whole
file's. Only where no such break comes within MAX_TEXT_CHUNK does a chunk end at any line break.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slide.errors import DataError

log = logging.getLogger(__name__)
BATCH_ROWS = 1024  # records per batch handed to the tokenizer
TEXT_CHUNK = 1 << 20  # bytes of a text file read at a time
MAX_TEXT_CHUNK = 16 << 20
BOM = b"\xef\xbb\xbf"
HF_FORMATS = {".json": "json", ".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}
ALPACA = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
ALPACA_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
    "{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
SHAPES = (
    '{"text"}, {"prompt", "completion"}, {"instruction", "input", "output"} (Alpaca) or '
    '{"messages": [{"role", "content"}, ...]} (chat)'
)
ROLES = ("system", "user", "assistant", "tool")
TRUNCATION = ("truncate", "drop")  # what becomes of a conversation longer than a sample


@dataclass(frozen=True, slots=True)
class Doc:
    """One document, or one chunk of a text file's single document."""

    text: str  # trained on
    prompt: str | None = None  # not trained on; tokenized with the special tokens (BOS)
    first: bool = True  # the document's start: special tokens go before `text` (no prompt)
    last: bool = True  # EOS follows


@dataclass(frozen=True, slots=True)
class Chat:
    """One conversation, as the chat template takes it; `where` names its record in errors."""

    messages: tuple[dict[str, Any], ...]
    where: str


@dataclass(frozen=True)
class DocSource:
    """A file's documents in batches, each with how far into the file it reaches."""

    unit: str  # of `total` and the positions: "B" (bytes) or "rows"
    total: int | None
    batches: Iterator[tuple[list[Doc | Chat], int]]


def read_docs(path: Path) -> DocSource:
    fmt = HF_FORMATS.get(path.suffix.lower())
    if fmt is not None:
        return DocSource("rows", None, _hf_batches(path, fmt))
    size = path.stat().st_size
    if path.suffix.lower() == ".jsonl":
        return DocSource("B", size, _jsonl_batches(path))
    return DocSource("B", size, _text_batches(path))


def holds_chat(path: Path) -> bool:
    """Whether `path`'s first record is a conversation (a file holds one kind of record)."""
    docs, _ = next(read_docs(path).batches, ([], 0))
    return bool(docs) and isinstance(docs[0], Chat)


def doc_of(row: Any, where: str) -> Doc | Chat:
    """A record as a document; `where` names it in the error (`file:line`, `file: row N`)."""
    if isinstance(row, dict) and "messages" in row:
        return chat_of(row["messages"], where)
    if isinstance(row, dict):
        if isinstance(row.get("text"), str):
            return Doc(row["text"])
        if isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            return Doc(row["completion"], prompt=row["prompt"])
        if isinstance(row.get("instruction"), str) and isinstance(row.get("output"), str):
            context = row.get("input") or ""
            template = ALPACA_INPUT if context else ALPACA
            return Doc(row["output"], prompt=template.format(instruction=row["instruction"],
                                                             input=context))  # fmt: skip
    found = f"keys {', '.join(map(str, row))}" if isinstance(row, dict) else type(row).__name__
    if isinstance(row, dict) and "conversations" in row:
        raise DataError(f"{where}: ShareGPT's conversations ({{from, value}}) are not read: give "
                        "chat records as messages, [{role, content}, ...]")  # fmt: skip
    raise DataError(f"{where}: expected {SHAPES}, found {found}")


def chat_of(messages: Any, where: str) -> Chat:
    """A conversation checked for what a chat template needs: turns with a known role and text."""
    if not isinstance(messages, list):
        raise DataError(f"{where}: messages is a {type(messages).__name__}, not a list of "
                        "{role, content} turns")  # fmt: skip
    if not messages:
        raise DataError(f"{where}: an empty conversation (messages needs at least one turn)")
    for n, turn in enumerate(messages, start=1):
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ROLES:
            raise DataError(f"{where}: message {n} has role {role!r}; known roles: "
                            f"{', '.join(ROLES)}")  # fmt: skip
        if not isinstance(turn.get("content"), str):
            raise DataError(f"{where}: message {n} ({role}) has no content (a string)")
    return Chat(tuple(messages), where)


def _jsonl_batches(path: Path) -> Iterator[tuple[list[Doc | Chat], int]]:
    import json

    docs: list[Doc | Chat] = []
    with path.open("rb") as f:
        offset = 0
        for n, raw in enumerate(f, start=1):
            start = len(BOM) if n == 1 and raw.startswith(BOM) else 0
            line = utf8(raw[start:], path, offset + start, line=n)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{n}: not JSON ({exc.msg})") from None
            docs.append(doc_of(row, f"{path}:{n}"))
            if len(docs) == BATCH_ROWS:
                yield docs, offset
                docs = []
    if docs:
        yield docs, offset


def _text_batches(path: Path) -> Iterator[tuple[list[Doc | Chat], int]]:
    with path.open("rb") as f:
        offset = len(BOM) if f.read(len(BOM)) == BOM else 0
        f.seek(offset)
        pending, first = bytearray(), True
        while block := f.read(TEXT_CHUNK):
            pending += block
            cut = _safe_cut(pending)
            if cut is None:
                continue
            yield [Doc(utf8(pending[:cut], path, offset), first=first, last=False)], offset + cut
            offset, first = offset + cut, False
            del pending[:cut]
        yield [Doc(utf8(pending, path, offset), first=first)], offset + len(pending)


def _safe_cut(buf: bytearray) -> int | None:
    """Where a chunk of `buf` may end: after its last line break between two visible ASCII
    characters; past MAX_TEXT_CHUNK, after its last line break of any kind (logged)."""
    i = buf.rfind(b"\n", 0, len(buf) - 1)
    while i > 0:
        if 0x21 <= buf[i - 1] <= 0x7E and 0x21 <= buf[i + 1] <= 0x7E:
            return i + 1
        i = buf.rfind(b"\n", 0, i)
    last = buf.rfind(b"\n")
    if len(buf) < MAX_TEXT_CHUNK or last < 0:
        return None
    log.warning("text data: no line break between two visible characters in %d MiB; cutting a "
                "chunk at a blank or indented line (its tokens there may differ from the whole "
                "file's)", len(buf) >> 20)  # fmt: skip
    return last + 1


def utf8(raw: bytes | bytearray, path: Path, offset: int, *, line: int | None = None) -> str:
    """`raw`, which starts at byte `offset` of `path`, decoded; else the first bad byte named."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = f" (line {line})" if line is not None else ""
        raise DataError(f"{path}: byte {offset + exc.start}{at} is not UTF-8 ({exc.reason}): "
                        "slide reads text as UTF-8") from None  # fmt: skip


def _check_utf8(path: Path) -> None:
    """The whole file decodes (the `datasets` JSON and CSV readers name no byte offset)."""
    with path.open("rb") as f:
        offset, carry = 0, b""
        while block := f.read(TEXT_CHUNK):
            raw = carry + block
            try:
                raw.decode("utf-8")
                carry = b""
            except UnicodeDecodeError as exc:
                if exc.reason != "unexpected end of data":
                    utf8(raw, path, offset)
                carry = raw[exc.start :]  # a character split by the block's end
                raw = raw[: exc.start]
            offset += len(raw)
        if carry:
            utf8(carry, path, offset)


def _hf_batches(path: Path, fmt: str) -> Iterator[tuple[list[Doc | Chat], int]]:
    try:
        import datasets
    except ModuleNotFoundError:
        raise DataError(f"{path}: {path.suffix} data is read with the `datasets` library, which "
                        "is not installed here: pip install 'slide[data]'") from None  # fmt: skip
    if fmt in ("json", "csv"):
        _check_utf8(path)
    rows = 0
    for batch in _hf_read(datasets, path, fmt):
        columns = list(batch)
        records = zip(*(batch[c] for c in columns), strict=True)
        docs = [doc_of(dict(zip(columns, r, strict=True)), f"{path}: row {rows + k + 1}")
                for k, r in enumerate(records)]  # fmt: skip
        rows += len(docs)
        yield docs, rows


def _hf_read(datasets: Any, path: Path, fmt: str) -> Iterator[dict[str, list[Any]]]:
    """The file's columns, BATCH_ROWS rows at a time (streamed: no copy in the HF cache)."""
    try:
        stream = datasets.load_dataset(fmt, data_files=str(path), split="train", streaming=True)
        yield from stream.iter(batch_size=BATCH_ROWS)
    except (ValueError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
        raise DataError(f"{path}: not readable as {fmt}: {exc}") from None
