"""`--packing documents`: whole documents packed into samples of S tokens, kept apart.

Samples are cut from the token stream by next fit, in stream order: a sample takes the
documents that start in it while they end within S tokens of its start, so it is one
contiguous stretch [a, b) of the stream, padded to S. A document longer than S fills samples
of its own, S tokens each (the last piece packed with what follows). Within a sample:

- positions restart at 0 at each document's first token (and at the sample's first), so token
  i's document begins at i - positions[i]: that is all the executor needs for the attention
  mask (i sees j iff i - positions[i] <= j <= i) and the RoPE tables of each row;
- labels are the next token of the same document: a document's last token has none (-100,
  the loss's ignore index), nor do the stream's untrained tokens (prompts) or the padding.
  A piece of a long document keeps its last label: the next token is the same document's.
- padding is PAD_ID tokens at positions 0, 1, ...: a document of its own that nothing else
  attends to, and no target.

Why next fit in stream order: the samples stay contiguous stretches, so a sample is read as
one slice of the memory-mapped stream, like stream packing's windows, and the shuffled order
is a permutation of sample indices as there. The spans (16 bytes a sample) are the only
thing held in RAM.
"""

from __future__ import annotations

from array import array

import numpy as np

PACKING = ("stream", "documents")  # --packing: one stream cut in windows; documents kept apart
PAD_ID = 0  # any id in the vocabulary: padding is neither attended to by a document nor a target
IGNORE_INDEX = -100


def document_spans(starts: np.ndarray, total: int, seq: int) -> np.ndarray:
    """(samples, 2) int64 [a, b) stretches of a stream of `total` tokens whose documents begin
    at `starts` (ascending), packed by next fit into samples of `seq`."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.append(starts[starts > 0], total)  # each document ends where the next begins
    # runs of samples: (first start, samples, tokens each), as arrays of int64 (24 bytes a run
    # where a list of tuples took ~100: ten million short documents are ten million runs)
    first, count, length = array("q"), array("q"), array("q")
    a = 0
    while a < total:
        k = int(np.searchsorted(ends, a + seq, side="right"))  # ends[k - 1]: the last within seq
        if k > 0 and ends[k - 1] > a:
            n, each = 1, int(ends[k - 1]) - a
        else:  # a document longer than seq: its full pieces at once (a text file is one)
            n, each = (int(ends[k]) - a) // seq, seq
        first.append(a)
        count.append(n)
        length.append(each)
        a += n * each
    firsts, counts, lengths = (np.frombuffer(c, dtype=np.int64) for c in (first, count, length))
    each_len = np.repeat(lengths, counts)  # per sample
    within = np.arange(len(each_len)) - np.repeat(np.cumsum(counts) - counts, counts)
    begins = np.repeat(firsts, counts) + within * each_len
    return np.stack([begins, begins + each_len], axis=1)


def document_sample(
    ids: np.ndarray,
    predict: np.ndarray | None,
    starts: np.ndarray,
    span: tuple[int, int],
    seq: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sample of stretch `span` = [a, b): (input ids, labels, positions), each (seq,) int64."""
    a, b = span
    n, total = b - a, len(ids)
    # documents beginning in (a, b]: each one's start ends the document before it
    lo, hi = np.searchsorted(starts, [a, b], side="right")
    inner = np.asarray(starts[lo:hi], dtype=np.int64) - a  # in (0, n]
    first = np.zeros(seq, dtype=np.bool_)  # a document's first token (the padding's too)
    first[0] = True
    first[inner[inner < n]] = True
    if n < seq:
        first[n] = True
    index = np.arange(seq)
    positions = index - np.maximum.accumulate(np.where(first, index, 0))
    inputs = np.full(seq, PAD_ID, dtype=np.int64)
    inputs[:n] = ids[a:b]
    labels = np.full(seq, IGNORE_INDEX, dtype=np.int64)
    after = min(b + 1, total)  # the token after the stretch belongs to a long document's piece
    labels[: after - a - 1] = ids[a + 1 : after]
    if predict is not None:
        labels[: after - a - 1][~predict[a + 1 : after]] = IGNORE_INDEX
    labels[inner - 1] = IGNORE_INDEX  # a document's last token: the next is another document's
    if b == total:
        labels[n - 1] = IGNORE_INDEX
    return inputs, labels, positions
