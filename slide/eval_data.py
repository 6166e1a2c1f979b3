"""The eval set of `slide train`: every window of `--eval-data`, or a held-out `--eval-fraction`
of the training data's windows, which training then never draws.

The held-out windows are a seeded choice (`--seed`, on a generator of their own, so the
training order's generator is the one a run without eval has) of round(F x windows) windows;
the training batches draw from the rest (`slide.data.batches(windows=...)`). An eval reads its
windows in index order, `batch` at a time, the last batch's missing rows padded with ignored
labels, so each eval is over the same tokens; `--eval-batches K` bounds it to the first K
batches (0: every window).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from slide.data import IGNORE_INDEX, TokenStream, check_vocab, window_rows
from slide.errors import DataError

HOLDOUT_STREAM = 1  # the held-out choice's generator: (seed, this), apart from the order's


def held_out(windows: int, fraction: float, seed: int, *, batch: int) -> np.ndarray:
    """The window indices `--eval-fraction` keeps out of training, ascending."""
    count = round(fraction * windows)
    if count < 1:
        raise DataError(f"--eval-fraction {fraction} of the data's {windows} windows holds out "
                        f"none: use at least {1 / windows:.3g}")  # fmt: skip
    if windows - count < batch:
        raise DataError(f"--eval-fraction {fraction} leaves {windows - count} of {windows} "
                        f"windows for training: one batch needs {batch}")  # fmt: skip
    rng = np.random.default_rng((seed, HOLDOUT_STREAM))
    return np.sort(rng.choice(windows, size=count, replace=False))


def training_windows(windows: int, held: np.ndarray) -> np.ndarray:
    """The windows left to training: all but `held`, ascending."""
    keep = np.ones(windows, dtype=bool)
    keep[held] = False
    return np.flatnonzero(keep)


@dataclass(frozen=True)
class EvalSet:
    """Windows of one token stream evaluated `batch` at a time."""

    stream: TokenStream
    windows: np.ndarray  # ascending window indices
    batch: int
    seq: int

    @classmethod
    def of(
        cls, stream: TokenStream, windows: np.ndarray | None, *, batch: int, seq: int,
        vocab_size: int, source: str,
    ) -> EvalSet:  # fmt: skip
        """`windows` of `stream` (None: every one), checked to hold something to evaluate."""
        check_vocab(stream, vocab_size, source)
        chosen = np.arange(stream.windows(seq)) if windows is None else windows
        if len(chosen) == 0:
            raise DataError(f"{source} holds {len(stream.ids)} tokens: no window of {seq} + 1")
        return cls(stream, chosen, batch, seq)

    def batches(self, limit: int) -> int:
        """Eval batches of at most `limit` (0: all of them)."""
        whole = -(-len(self.windows) // self.batch)
        return min(limit, whole) if limit else whole

    def iterate(self, count: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The first `count` batches; the last rows past the windows are padding: token 0,
        every label ignored."""
        for k in range(count):
            idx = [int(i) for i in self.windows[k * self.batch : (k + 1) * self.batch]]
            ids, labels = window_rows(self.stream, idx, self.seq)
            if len(idx) < self.batch:
                pad = self.batch - len(idx)
                ids = torch.cat([ids, torch.zeros(pad, self.seq, dtype=torch.int64)])
                labels = torch.cat([labels, torch.full((pad, self.seq), IGNORE_INDEX)])
            yield ids, labels
        self.stream.release()
