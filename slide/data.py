"""Training data as token windows: JSONL, plain text or a 1-D token-id .npy file.

Everything is turned into one token stream with a per-token "predict me" mask, then cut into
windows of S+1 tokens: sample i is tokens[i*S : i*S + S + 1], its inputs the first S, its labels
the last S (-100 where the mask is off: prompt tokens of prompt/completion pairs). Batches take
consecutive samples in order, or a seeded permutation per epoch. Bad data is refused here, before
any model is built.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

IGNORE_INDEX = -100
CORPUS = Path(__file__).parent / "assets" / "corpus.txt"


class DataError(ValueError):
    """The data file cannot feed training; the message names the file and the problem."""


@dataclass(frozen=True)
class TokenStream:
    ids: np.ndarray  # (N,) int64
    predict: np.ndarray  # (N,) bool: whether token t is a training target

    def windows(self, seq: int) -> int:
        return (len(self.ids) - 1) // seq


def load_token_stream(path: str | Path, *, tokenizer_dir: str | Path | None = None) -> TokenStream:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if path.stat().st_size == 0:
        raise DataError(f"data file {path} is empty")
    if path.suffix == ".npy":
        return _from_npy(path)
    if tokenizer_dir is None:
        raise DataError(f"{path} is text: pass --tokenizer DIR (a local Hugging Face tokenizer)")
    tokenizer = load_tokenizer(tokenizer_dir)
    if path.suffix == ".jsonl":
        return _from_jsonl(path, tokenizer)
    return _pack([(tokenizer.encode(path.read_text(encoding="utf-8")), None)], tokenizer)


def load_tokenizer(tokenizer_dir: str | Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    if not Path(tokenizer_dir).is_dir():
        raise DataError(f"tokenizer directory {tokenizer_dir} does not exist")
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def _from_npy(path: Path) -> TokenStream:
    try:
        ids = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise DataError(f"{path} is not a readable .npy array: {exc}") from None
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise DataError(
            f"{path} must hold a 1-D integer array of token ids, got {ids.dtype} {ids.shape}"
        )
    if ids.size and ids.min() < 0:
        raise DataError(f"{path} holds negative token ids")
    ids = ids.astype(np.int64)
    return TokenStream(ids=ids, predict=np.ones_like(ids, dtype=bool))


def _from_jsonl(path: Path, tokenizer) -> TokenStream:  # type: ignore[no-untyped-def]
    docs: list[tuple[list[int], int | None]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if isinstance(row, dict) and isinstance(row.get("text"), str):
            docs.append((tokenizer.encode(row["text"]), None))
        elif isinstance(row, dict) and {"prompt", "completion"} <= row.keys():
            prompt = tokenizer.encode(row["prompt"])
            docs.append(
                (
                    prompt + tokenizer.encode(row["completion"], add_special_tokens=False),
                    len(prompt),
                )
            )
        else:
            raise DataError(
                f'{path}:{n}: expected {{"text": ...}} or {{"prompt": ..., "completion": ...}}'
            )
    if not docs:
        raise DataError(f"{path} holds no records")
    return _pack(docs, tokenizer)


def _pack(docs: list[tuple[list[int], int | None]], tokenizer) -> TokenStream:  # type: ignore[no-untyped-def]
    """Concatenate documents, each followed by EOS; prompt tokens are not targets."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    predict: list[bool] = []
    for tokens, prompt_len in docs:
        doc = tokens + ([eos] if eos is not None else [])
        ids += doc
        cut = prompt_len or 0
        predict += [False] * cut + [True] * (len(doc) - cut)
    return TokenStream(ids=np.asarray(ids, dtype=np.int64), predict=np.asarray(predict, dtype=bool))


def batches(
    stream: TokenStream,
    *,
    batch: int,
    seq: int,
    count: int,
    shuffle: bool = True,
    seed: int = 0,
    vocab_size: int | None = None,
    source: str = "data",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`count` batches of (input_ids, labels), each (batch, seq) int64; epochs repeat."""
    windows = stream.windows(seq)
    if windows < batch:
        need = batch * seq + 1
        raise DataError(
            f"{source} holds {len(stream.ids)} tokens: one batch of {batch} x {seq} needs {need}"
        )
    if vocab_size is not None and stream.ids.max() >= vocab_size:
        raise DataError(
            f"{source} holds token id {stream.ids.max()} >= the model's vocab_size {vocab_size}"
        )
    order = _window_order(windows, shuffle, seed)
    for _ in range(count):
        idx = [next(order) for _ in range(batch)]
        rows = np.stack([stream.ids[i * seq : i * seq + seq + 1] for i in idx])
        keep = np.stack([stream.predict[i * seq + 1 : i * seq + seq + 1] for i in idx])
        labels = np.where(keep, rows[:, 1:], IGNORE_INDEX)
        yield torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(labels)


def _window_order(windows: int, shuffle: bool, seed: int) -> Iterator[int]:
    rng = np.random.default_rng(seed)
    while True:
        yield from (rng.permutation(windows) if shuffle else range(windows))
