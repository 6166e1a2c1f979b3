"""Training data as token windows: a 1-D token-id .npy file, or any format `slide.data_formats`
reads (JSONL, JSON arrays, parquet, arrow, CSV, text), tokenized once into a memory-mapped
cache (`slide.token_cache`).

Either way the data is one token stream with a per-token "predict me" mask (and, from a
cache, where each document starts), cut into windows of S+1 tokens: sample i is
tokens[i*S : i*S + S + 1], its inputs the first S, its labels the last S (-100 where the mask
is off: prompt tokens). `--packing documents` cuts it into whole documents instead, each batch
with the tokens' positions in their documents (`slide.packing`). Batches take consecutive
samples in order, or a seeded permutation per epoch. The stream stays on disk: a batch reads only its windows,
and the pages it mapped are dropped before they reach RELEASE_BYTES, so host RSS does not grow
with the data set (the kernel's page cache keeps them for the next read). Bad data is refused here,
before any model is built.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from slide import token_cache
from slide.chat_data import LengthLimit
from slide.errors import DataError
from slide.packing import IGNORE_INDEX, PACKING, document_sample, document_spans

RELEASE_BYTES = 16 << 20  # of mapped pages a batch loop lets accumulate
FAULT_AROUND = 64 << 10  # what a page fault maps beside the page (Linux's fault_around_bytes)
SCAN = 1 << 24  # ids checked at a time in a .npy file


@dataclass(frozen=True)
class TokenStream:
    ids: np.ndarray  # (N,) integer ids, usually a read-only memmap
    predict: np.ndarray | None  # (N,) bool: whether token t is a training target; None: all
    max_id: int
    targets: int  # tokens that are training targets (counted when the cache was made)
    cache: Path | None = None  # the token cache it was read from
    starts: np.ndarray | None = None  # (documents,) int64 first tokens; None: unknown (.npy)

    def windows(self, seq: int) -> int:
        return (len(self.ids) - 1) // seq

    def release(self) -> None:
        _drop_pages(self.ids, self.predict, self.starts)


def load_token_stream(
    path: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    limit: LengthLimit | None = None,
) -> TokenStream:
    """`path`'s tokens: a .npy read in place, anything else from its token cache under
    `cache_dir` (prepared first, with a progress bar if `progress`, when there is none); chat
    conversations fit to `limit` (`slide.chat_data`)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"data {path} is a directory: name a file (JSONL, JSON, parquet, arrow, "
                        "CSV, text or a token-id .npy)")  # fmt: skip
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if path.stat().st_size == 0:
        raise DataError(f"data file {path} is empty")
    if path.suffix == ".npy":
        return _from_npy(path)
    if tokenizer_dir is None:
        raise DataError(f"{path} is not token ids: pass --tokenizer DIR (a local Hugging Face "
                        "tokenizer)")  # fmt: skip
    root = Path(cache_dir) if cache_dir is not None else token_cache.DEFAULT_ROOT
    cache = token_cache.load(path, Path(tokenizer_dir), root, progress=progress, limit=limit)
    return TokenStream(ids=cache.ids(), predict=cache.predict(), max_id=cache.meta["max_id"],
                       targets=cache.meta["targets"], cache=cache.directory,
                       starts=cache.starts())  # fmt: skip


def _from_npy(path: Path) -> TokenStream:
    try:
        ids = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise DataError(f"{path} is not a readable .npy array: {exc}") from None
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise DataError(
            f"{path} must hold a 1-D integer array of token ids, got {ids.dtype} {ids.shape}"
        )
    lo, hi = 0, 0
    for start in range(0, len(ids), SCAN):
        part = ids[start : start + SCAN]
        lo, hi = min(lo, int(part.min())), max(hi, int(part.max()))
        _drop_pages(ids)
    if lo < 0:
        raise DataError(f"{path} holds negative token ids")
    return TokenStream(ids=ids, predict=None, max_id=hi, targets=len(ids))


def _drop_pages(*arrays: np.ndarray | None) -> None:
    """Unmap from this process the pages of memory-mapped arrays read so far (the page cache
    keeps them; a later read maps them again)."""
    for array in arrays:
        if array is not None and isinstance(array.base, mmap.mmap):
            array.base.madvise(mmap.MADV_DONTNEED)


def batches(
    stream: TokenStream,
    *,
    batch: int,
    seq: int,
    count: int,
    start: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    vocab_size: int | None = None,
    source: str = "data",
    packing: str = "stream",
    samples: np.ndarray | None = None,
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Batches `start` to `count` - 1 of (input_ids, labels), each (batch, seq) int64, and
    with `packing="documents"` their positions (`slide.packing`); epochs repeat. The ones
    before `start` (a resume's) advance the order without being read. `samples`: the sample
    indices to draw from (the others held out for eval); None: all."""
    total, sample = sampler(stream, seq, packing, source)
    drawn = total if samples is None else len(samples)
    if drawn < batch:
        held = "" if samples is None else f" ({drawn} samples of {seq} left for training)"
        raise DataError(_too_short(stream, batch, seq, total, packing, source) + held)
    check_vocab(stream, vocab_size, source)
    order = _window_order(drawn, shuffle, seed)
    # each window maps its own pages and the fault-around beside them, in each array
    arrays = 1 if stream.predict is None else 2
    mapped, per_batch = 0, batch * arrays * ((seq + 1) * stream.ids.itemsize + FAULT_AROUND)
    for n in range(count):
        idx = [int(next(order)) for _ in range(batch)]  # i * seq overflows an int32
        if n < start:
            continue
        if samples is not None:
            idx = [int(samples[i]) for i in idx]
        mapped += per_batch
        if mapped >= RELEASE_BYTES:
            stream.release()
            mapped = 0
        yield stack_samples([sample(i) for i in idx])


def check_vocab(stream: TokenStream, vocab_size: int | None, source: str) -> None:
    if vocab_size is not None and stream.max_id >= vocab_size:
        raise DataError(
            f"{source} holds token id {stream.max_id} >= the model's vocab_size {vocab_size}"
        )


Sample = Callable[[int], tuple[np.ndarray, ...]]


def stack_samples(rows: list[tuple[np.ndarray, ...]]) -> tuple[torch.Tensor, ...]:
    """One batch from samples: each part (inputs, labels[, positions]) stacked to (rows, seq)."""
    return tuple(torch.from_numpy(np.stack(parts)) for parts in zip(*rows, strict=True))


def sample_count(stream: TokenStream, seq: int, packing: str, source: str) -> int:
    """The samples of `seq` tokens `packing` cuts from the stream."""
    return sampler(stream, seq, packing, source)[0]


def sampler(stream: TokenStream, seq: int, packing: str, source: str) -> tuple[int, Sample]:
    """How many samples `packing` cuts from the stream, and sample i's (inputs, labels[,
    positions]), each (seq,) int64."""
    if packing == "stream":
        return stream.windows(seq), lambda i: _window(stream, seq, i)
    if packing != "documents":
        raise ValueError(f"packing must be one of {', '.join(PACKING)}, got {packing!r}")
    starts = stream.starts
    if starts is None:
        raise DataError(f"{source} is token ids with no document boundaries: --packing "
                        "documents needs data Slide tokenizes (JSONL, JSON, parquet, arrow, "
                        "CSV or text, with --tokenizer)")  # fmt: skip
    spans = document_spans(starts, len(stream.ids), seq)
    return len(spans), lambda i: document_sample(
        stream.ids, stream.predict, starts, (int(spans[i, 0]), int(spans[i, 1])), seq
    )


def _window(stream: TokenStream, seq: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Window i of the stream: tokens i*seq .. i*seq + seq as inputs, the next ones as labels."""
    row = stream.ids[i * seq : i * seq + seq + 1].astype(np.int64)
    labels = row[1:]
    if stream.predict is not None:
        labels = np.where(stream.predict[i * seq + 1 : i * seq + seq + 1], labels, IGNORE_INDEX)
    return row[:-1].copy(), np.ascontiguousarray(labels)


def _too_short(
    stream: TokenStream, batch: int, seq: int, samples: int, packing: str, source: str
) -> str:
    if packing == "documents":
        return (f"{source} packs into {samples} samples of {seq} tokens (--packing "
                f"documents): one batch of {batch} needs {batch}")  # fmt: skip
    need = batch * seq + 1
    return f"{source} holds {len(stream.ids)} tokens: one batch of {batch} x {seq} needs {need}"


def _window_order(windows: int, shuffle: bool, seed: int) -> Iterator[int]:
    """Window indices, epoch after epoch. A shuffled epoch is `rng.permutation(windows)` (the
    order checkpoints resume), drawn over int32 where it fits: the same order in half the
    memory (4 MB per million windows; a 1 GB JSONL holds about two million at seq 128)."""
    rng = np.random.default_rng(seed)
    dtype = np.int32 if windows < 2**31 else np.int64
    while True:
        yield from (rng.permutation(np.arange(windows, dtype=dtype)) if shuffle else range(windows))
