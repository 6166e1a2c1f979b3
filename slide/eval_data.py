"""The eval set of `slide train`: every window of `--eval-data`, or a held-out `--eval-fraction`
of the training data's windows, which training then never draws (with `--packing documents` the
windows are its packed samples).

The held-out windows are a seeded choice (`--seed`, on a generator of their own, so the
training order's generator is the one a run without eval has) of round(F x windows) windows;
the training batches draw from the rest (`slide.data.batches(samples=...)`). An eval reads its
windows in index order, `batch` at a time, the last batch's missing rows padded with ignored
labels, so each eval is over the same tokens; `--eval-batches K` bounds it to the first K
batches (0: every window).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from slide.data import IGNORE_INDEX, Sample, TokenStream, check_vocab, sampler, stack_samples
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
    """Samples of one token stream (windows, or packed documents) evaluated `batch` at a time."""

    stream: TokenStream
    sample: Sample  # sample i's (inputs, labels[, positions])
    samples: np.ndarray  # ascending sample indices
    batch: int
    seq: int

    @classmethod
    def of(
        cls, stream: TokenStream, samples: np.ndarray | None, *, batch: int, seq: int,
        vocab_size: int, source: str, packing: str = "stream",
    ) -> EvalSet:  # fmt: skip
        """`samples` of `stream` (None: every one), checked to hold something to evaluate."""
        check_vocab(stream, vocab_size, source)
        total, sample = sampler(stream, seq, packing, source)
        chosen = np.arange(total) if samples is None else samples
        if len(chosen) == 0:
            raise DataError(f"{source} holds {len(stream.ids)} tokens: no window of {seq} + 1")
        return cls(stream, sample, chosen, batch, seq)

    def batches(self, limit: int) -> int:
        """Eval batches of at most `limit` (0: all of them)."""
        whole = -(-len(self.samples) // self.batch)
        return min(limit, whole) if limit else whole

    def iterate(self, count: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """The first `count` batches; the last rows past the samples are padding: token 0 at
        position 0, every label ignored."""
        for k in range(count):
            idx = [int(i) for i in self.samples[k * self.batch : (k + 1) * self.batch]]
            parts = stack_samples([self.sample(i) for i in idx])
            pad = self.batch - len(idx)
            if pad:
                fill = [0, IGNORE_INDEX, 0]
                parts = tuple(
                    torch.cat([t, torch.full((pad, self.seq), fill[j], dtype=t.dtype)])
                    for j, t in enumerate(parts)
                )
            yield parts
        self.stream.release()
