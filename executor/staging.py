"""The host buffers each micro-batch's token ids and labels (and, for packed documents, the
tokens' positions in their documents) wait in for their upload.

A fixed ring of slots, allocated with the engine (pinned on CUDA), instead of a
`Tensor.pin_memory()` per micro-batch: those took blocks from torch's caching host allocator
every step, a block staying taken until its copy had run, so a slow step could grow that pool
for good (the design's rule: the steady state allocates nothing).

Invariant: the driver feeds at most one step ahead of the step it waits for, and waits for a
step's ops (device work included) before reporting it, so with two steps' micro-batches of
slots a slot comes round again only after the forward that uploaded it has finished. On CUDA
each slot's upload also records an event the next `stage` of that slot synchronises on, and a
slot handed out but not yet uploaded is never reused: `stage` raises instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class TokenSlot:
    ids: torch.Tensor  # (B, S) int64, host (pinned on CUDA)
    labels: torch.Tensor  # (B, S) int64, host (pinned on CUDA)
    positions: torch.Tensor | None  # (B, S) int64, host (pinned on CUDA); None: no documents
    uploaded: torch.cuda.Event | None  # recorded on the gpu lane's stream after the copies
    waiting: bool = False  # handed to a micro-batch whose forward has not copied it yet

    def mark_uploaded(self) -> None:
        """Called by the forward that copied the slot, on the stream that copied it."""
        if self.uploaded is not None:
            self.uploaded.record()
        self.waiting = False


class TokenStaging:
    """`slots` (ids, labels[, positions]) of `shape`, handed out in turn; positions where
    `documents` (packed documents)."""

    def __init__(
        self, shape: tuple[int, int], slots: int, cuda: bool, documents: bool = False
    ) -> None:
        def host() -> torch.Tensor:
            return torch.empty(shape, dtype=torch.int64, pin_memory=cuda)

        self.documents = documents
        event = torch.cuda.Event if cuda else lambda: None
        self._slots = [
            TokenSlot(host(), host(), host() if documents else None, event()) for _ in range(slots)
        ]
        self._next = 0

    def stage(
        self, ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None
    ) -> TokenSlot:
        """The next slot, holding a copy of `ids`, `labels` and `positions`."""
        slot = self._slots[self._next]
        if slot.waiting:
            raise RuntimeError(
                f"token staging slot {self._next} of {len(self._slots)} is still waiting for "
                "its upload: the driver fed more than two steps ahead"
            )
        self._next = (self._next + 1) % len(self._slots)
        if slot.uploaded is not None:
            slot.uploaded.synchronize()  # its last upload has run (it has, by the invariant)
        slot.ids.copy_(ids)
        slot.labels.copy_(labels)
        if slot.positions is not None:
            assert positions is not None, "packed documents: a micro-batch without positions"
            slot.positions.copy_(positions)
        slot.waiting = True
        return slot


class DataError(ValueError):
    pass


FIELDS = ("input_ids", "labels", "positions")


def check_batch(batch: tuple[torch.Tensor, ...], shape: tuple[int, int], documents: bool,
                where: str) -> None:  # fmt: skip
    """A batch is (input_ids, labels), or for packed documents (input_ids, labels, positions),
    each int64 of `shape`; packed positions count 0, 1, ... from each document's first token:
    anything else would let a token attend outside its document."""
    fields = FIELDS if documents else FIELDS[:2]
    if len(batch) != len(fields):
        raise DataError(f"{where}: a batch of {len(batch)} tensors; this run takes "
                        f"{len(fields)} ({', '.join(fields)})")  # fmt: skip
    for what, t in zip(fields, batch, strict=True):
        if tuple(t.shape) != shape or t.dtype != torch.int64:
            raise DataError(f"{where}: {what} must be int64 {shape}, got {t.dtype} "
                            f"{tuple(t.shape)}")  # fmt: skip
    if documents:
        positions = batch[2]
        steps = positions[:, 1:] - positions[:, :-1]
        if bool((positions[:, 0] != 0).any()) or not bool(
            ((steps == 1) | (positions[:, 1:] == 0)).all()
        ):
            raise DataError(f"{where}: positions must start at 0 in each row and count up by 1 "
                            "within a document (0 at each document's first token)")  # fmt: skip
