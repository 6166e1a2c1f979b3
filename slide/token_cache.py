"""Token caches: a data file tokenized once into memory-mapped files, reused by later runs and
resumes (`slide data` prepares one; `slide train` prepares it where it is missing).

    CACHE/<key>/ids.bin       the token ids, uint16 (a vocabulary of <= 65,536) or uint32
    CACHE/<key>/predict.bin   one byte per token, 1 where it is a training target (absent when
                              every token is one)
    CACHE/<key>/starts.bin    each document's first token, int64 offsets in order (a record,
                              a conversation, a text file): `--packing documents` keeps them apart
    CACHE/<key>/meta.json     counts, dtype, the largest id; the source and tokenizer it came from

<key> hashes FORMAT, the data file's bytes and the tokenizer's files (and, for chat data, the
`LengthLimit` its conversations were fit to): an edited file or another tokenizer gets a new
cache, a renamed or moved file finds its old one. CACHE is
~/.cache/slide/tokens unless `--data-cache` names another: nothing is written beside the
user's data, which may be read-only or shared.

Invariants:
- A cache is complete or absent: it is written into `CACHE/.tmp-<key>-<host>-<pid>/`, fsynced,
  and published by one rename. A killed preparation leaves only that temporary directory; the
  next preparation on the host removes it once its process is gone.
- Preparation streams: one batch of documents (`slide.data_formats`) at a time is tokenized
  and appended to the files, so its memory is a batch's, not the data set's.
- Slide removes nothing else under CACHE; a cache deleted by hand is rebuilt when next needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from slide.chat_data import FitCounts, LengthLimit, encode_chats, fit_report
from slide.data_formats import Chat, Doc, holds_chat, read_docs
from slide.errors import DataError
from slide.fileio import fsync_path, write_atomic
from slide.tokenizer import load_tokenizer, tokenizer_files

log = logging.getLogger(__name__)
FORMAT = 2  # bump when what a cache holds, or how records become tokens, changes
DEFAULT_ROOT = Path.home() / ".cache" / "slide" / "tokens"
IDS, PREDICT, STARTS, META = "ids.bin", "predict.bin", "starts.bin", "meta.json"
TMP = ".tmp-"


@dataclass(frozen=True)
class Cache:
    """A published cache: its directory and meta.json."""

    directory: Path
    meta: dict[str, Any]

    def ids(self) -> np.memmap:
        return self._map(IDS, np.dtype(self.meta["dtype"]))

    def predict(self) -> np.memmap | None:
        """The target mask, or None: every token is a target."""
        if self.meta["targets"] == self.tokens:
            return None
        return self._map(PREDICT, np.dtype(np.bool_))

    def starts(self) -> np.memmap:
        """(documents,) int64 (searched beside int64 offsets without a conversion): the offset
        of each document's first token, ascending."""
        return self._map(STARTS, np.dtype(np.int64), int(self.meta["documents"]))

    @property
    def tokens(self) -> int:
        return int(self.meta["tokens"])

    def _map(self, name: str, dtype: np.dtype, count: int | None = None) -> np.memmap:
        count = self.tokens if count is None else count
        file = self.directory / name
        if not file.is_file() or file.stat().st_size != count * dtype.itemsize:
            raise DataError(f"token cache {self.directory} is damaged ({name}): delete that "
                            "directory and it is rebuilt")  # fmt: skip
        return np.memmap(file, dtype=dtype, mode="r", shape=(count,))


def load(
    data: Path, tokenizer_dir: Path, root: Path, *, progress: bool, limit: LengthLimit | None = None
) -> Cache:
    """The cache of `data` tokenized by `tokenizer_dir`, prepared first if there is none; chat
    data's conversations fit to `limit` (None: none is cut), what that changed logged."""
    chat = holds_chat(data)
    directory = root / cache_key(data, tokenizer_dir, limit.key() if chat and limit else "")
    if (directory / META).is_file():
        log.info("data: %s's tokens from %s", data, directory)
    else:
        _prepare(data, tokenizer_dir, directory, progress, chat, limit)
    cache = Cache(directory, json.loads((directory / META).read_text(encoding="utf-8")))
    if chat and (said := fit_report(FitCounts(**cache.meta["chats"]), limit)):
        log.warning(said)
    return cache


def cache_key(data: Path, tokenizer_dir: Path, shape: str = "") -> str:
    """`shape`: how records were fit to a sample (`LengthLimit.key`), where that matters."""
    digest = hashlib.sha256(f"slide-tokens/{FORMAT}\n".encode())
    if shape:
        digest.update(shape.encode() + b"\0")
    with data.open("rb") as f:
        digest.update(hashlib.file_digest(f, "sha256").digest())
    for file in tokenizer_files(tokenizer_dir):
        digest.update(file.name.encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()[:32]


def _prepare(
    data: Path,
    tokenizer_dir: Path,
    directory: Path,
    progress: bool,
    chat: bool,
    limit: LengthLimit | None,
) -> None:
    tokenizer = load_tokenizer(tokenizer_dir)
    root = directory.parent
    root.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(root)
    tmp = root / f"{TMP}{directory.name}-{socket.gethostname()}-{os.getpid()}"
    tmp.mkdir()
    log.info("data: tokenizing %s once into %s", data, directory)
    try:
        meta = _write(tmp, data, tokenizer, progress, chat, limit)
        meta |= {"source": str(data.resolve()), "tokenizer": str(tokenizer_dir.resolve())}
        write_atomic(tmp / META, json.dumps(meta, indent=2))
        fsync_path(tmp)
        try:
            tmp.rename(directory)
        except OSError:  # another process published the same cache first
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(root)


def _write(
    tmp: Path, data: Path, tokenizer: Any, progress: bool, chat: bool, limit: LengthLimit | None
) -> dict[str, Any]:
    """Tokenize `data` into tmp's files, a batch of documents at a time; its meta.json fields."""
    source = read_docs(data)
    counts = FitCounts()
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 2**16 else np.uint32)
    tokens = targets = max_id = documents = 0
    bar = tqdm(total=source.total, unit=source.unit, unit_scale=True, unit_divisor=1024,
               desc=f"tokenizing {data.name}", disable=not progress)  # fmt: skip
    names = (IDS, PREDICT, STARTS)
    with contextlib.ExitStack() as files, bar:
        ids_file, predict_file, starts_file = (files.enter_context(open(tmp / n, "wb"))
                                               for n in names)  # fmt: skip
        for docs, position in source.batches:
            ids, predict, starts = _encode_batch(tokenizer, docs, data, chat, limit, counts)
            ids_file.write(ids.astype(dtype).tobytes())
            predict_file.write(predict.tobytes())
            starts_file.write((starts + tokens).astype(np.int64).tobytes())
            tokens, targets = tokens + len(ids), targets + int(predict.sum())
            documents += len(starts)
            max_id = max(max_id, int(ids.max(initial=0)))
            bar.update(position - bar.n)
        for f in (ids_file, predict_file, starts_file):
            f.flush()
            os.fsync(f.fileno())
    if tokens == 0:
        dropped = f" ({counts.dropped} conversations dropped by --seq)" if counts.dropped else ""
        raise DataError(f"{data} holds no records{dropped}")
    if targets == tokens:
        (tmp / PREDICT).unlink()
    chats = {"chats": asdict(counts)} if chat else {}
    return {"format": FORMAT, "tokens": tokens, "targets": targets, "dtype": dtype.name,
            "max_id": max_id, "eos": tokenizer.eos_token_id, "documents": documents,
            **chats}  # fmt: skip


def _encode_batch(
    tokenizer: Any,
    docs: list[Doc | Chat],
    data: Path,
    chat: bool,
    limit: LengthLimit | None,
    counts: FitCounts,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's tokens: conversations through their chat template, other records by `encode`;
    (ids, predict, the batch's document starts)."""
    if any(isinstance(d, Chat) != chat for d in docs):
        raise DataError(f"{data} mixes chat records (messages) with other kinds: give one kind "
                        "of record per file")  # fmt: skip
    if chat:
        return encode_chats(tokenizer, docs, limit, counts)
    return encode(tokenizer, docs)


def encode(tokenizer: Any, docs: list[Doc]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents' tokens in order, (ids int64, predict bool, starts int64: where each
    document with `first` begins), each `last` one followed by EOS. A prompt takes the special
    tokens and is no target; its text then takes none, as does a text file's chunk after the
    first (which continues its document: no start)."""
    prompts = iter(_ids(tokenizer, [d.prompt for d in docs if d.prompt is not None], True))
    opening = iter(_ids(tokenizer, [d.text for d in docs if d.prompt is None and d.first], True))
    rest = iter(_ids(tokenizer, [d.text for d in docs if d.prompt is not None or not d.first],
                     False))  # fmt: skip
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    pieces, untrained, starts, start = [], [], [], 0
    for d in docs:
        if d.first:
            starts.append(start)
        head = next(prompts) if d.prompt is not None else []
        body = next(opening if d.prompt is None and d.first else rest)
        pieces += [head, body, eos if d.last else []]
        untrained.append((start, start + len(head)))
        start += len(head) + len(body) + (len(eos) if d.last else 0)
    ids = np.fromiter(chain.from_iterable(pieces), dtype=np.int64, count=start)
    predict = np.ones(start, dtype=np.bool_)
    for a, b in untrained:
        predict[a:b] = False
    return ids, predict, np.array(starts, dtype=np.int64)


def _ids(tokenizer: Any, texts: list[str], specials: bool) -> list[list[int]]:
    if not texts:
        return []
    out = tokenizer(texts, add_special_tokens=specials, return_attention_mask=False)
    return out["input_ids"]


def _remove_dead_temporaries(root: Path) -> None:
    """Temporary directories of preparations on this host whose process is gone."""
    host = socket.gethostname()
    for d in root.iterdir():
        rest, _, pid = d.name.rpartition("-")
        ours = d.name.startswith(TMP) and rest.endswith(f"-{host}") and pid.isdigit()
        if ours and not _alive(int(pid)):
            log.info("data: removing %s (a preparation that was killed)", d)
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
