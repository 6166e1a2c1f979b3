"""The data of a `slide train` run: its batches from the step it starts at, its eval set (held
out of the data, or a file of its own), and the tokens behind both, read from their caches
(prepared on first use). The bundled corpus's tiny tokenizer is built here once per user.

The first batch is pulled when the run is prepared, so bad data fails before the model is built.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from slide.chat_data import LengthLimit
from slide.data import TokenStream, batches, load_token_stream, sample_count
from slide.eval_data import EvalSet, held_out, training_windows
from slide.tokenizer import CORPUS, build_tiny_tokenizer
from slide.train_request import TrainRequest
from slide_ir.specs.model import ModelSpec

TINY_TOKENIZER = Path.home() / ".cache" / "slide" / "tiny-tokenizer"


def training_data(
    req: TrainRequest, spec: ModelSpec, start: int
) -> tuple[Iterator[tuple[torch.Tensor, ...]], EvalSet | None]:
    """The run's batches from step `start` on, and its eval set (`slide.eval_data`); the
    first batch is pulled now, so bad data fails before the model is built."""
    config, stream, source = req.config, _token_stream(req), req.data or str(CORPUS)
    train_windows, eval_set = None, None
    if req.eval_fraction is not None:
        windows = sample_count(stream, config.seq, req.packing, source)
        held = held_out(windows, req.eval_fraction, req.seed, batch=config.batch)
        train_windows = training_windows(windows, held)
        eval_set = EvalSet.of(stream, held, batch=config.batch, seq=config.seq,
                              vocab_size=spec.vocab_size, source=source,
                              packing=req.packing)  # fmt: skip
    elif req.eval_data is not None:
        eval_stream = _token_stream(req, req.eval_data)
        eval_set = EvalSet.of(eval_stream, None, batch=config.batch, seq=config.seq,
                              vocab_size=spec.vocab_size, source=req.eval_data,
                              packing=req.packing)  # fmt: skip
    it = batches(
        stream,
        batch=config.batch,
        seq=config.seq,
        count=config.steps * config.grad_accum,
        start=start * config.grad_accum,
        shuffle=req.shuffle,
        seed=req.seed,
        vocab_size=spec.vocab_size,
        source=source,
        packing=req.packing,
        samples=train_windows,
    )
    first = next(it)
    return itertools.chain([first], it), eval_set


def _token_stream(req: TrainRequest, path: str | None = None) -> TokenStream:
    """The run's tokens (or `path`'s: the eval data), from their cache (prepared now, with a
    progress bar, if missing)."""
    return load_token_stream(path or req.data or CORPUS, tokenizer_dir=_data_tokenizer(req),
                             cache_dir=req.data_cache, progress=req.progress,
                             limit=LengthLimit(req.config.seq, req.truncation))  # fmt: skip


def _data_tokenizer(req: TrainRequest) -> str | Path | None:
    """The tokenizer of the run's data: --tokenizer, else the bundled corpus's own."""
    return req.tokenizer or (None if req.data else tiny_tokenizer())


def tiny_tokenizer() -> Path:
    """The bundled corpus's tokenizer, built once per user: aside, then renamed into place
    (the ranks torchrun starts together may all build it; the first rename wins)."""
    if (TINY_TOKENIZER / "tokenizer.json").is_file():
        return TINY_TOKENIZER
    aside = TINY_TOKENIZER.with_name(f".tmp-{TINY_TOKENIZER.name}-{os.getpid()}")
    build_tiny_tokenizer(aside)
    try:
        aside.rename(TINY_TOKENIZER)
    except OSError:  # another process's is in place
        shutil.rmtree(aside, ignore_errors=True)
    return TINY_TOKENIZER
