"""The host slots each micro-batch's token ids and labels (and, for packed documents, the
tokens' positions in their documents) wait in for their upload: the Program's host token pool
(`PoolRole.HOST_TOKENS`), a slot per micro-batch of `GraphInfo.feed_ahead` + 1 steps.

Fixed slots, allocated with the engine (pinned on CUDA), instead of a `Tensor.pin_memory()` per
micro-batch: those took blocks from torch's caching host allocator every step, a block staying
taken until its copy had run, so a slow step could grow that pool for good (the design's rule:
the steady state allocates nothing).

Invariant: the driver stages a micro-batch into the slot its embedding's forward reads (the
graph's `Role.FEED` value), and only after the step that last read that slot is done (the
graph's edges say so too, for the simulator). On CUDA each slot's upload also records an event
the next `stage` of that slot synchronises on, and a slot staged but not yet uploaded is never
restaged: `stage` raises instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class TokenSlot:
    ids: torch.Tensor  # (B, S) int64, host (pinned on CUDA)
    labels: torch.Tensor  # (B, S) int64, host (pinned on CUDA)
    positions: torch.Tensor | None  # (B, S) int64, host (pinned on CUDA); None: no documents
    uploaded: torch.cuda.Event | None  # recorded on the gpu lane's stream after the copies
    waiting: bool = False  # staged for a micro-batch whose forward has not copied it yet

    def mark_uploaded(self) -> None:
        """Called by the forward that copied the slot, on the stream that copied it."""
        if self.uploaded is not None:
            self.uploaded.record()
        self.waiting = False


class TokenStaging:
    """The host token slots by slot id; `documents` when they hold positions (packed
    documents: the Program's token pools have that field)."""

    def __init__(self, slots: Mapping[str, TokenSlot]) -> None:
        self._slots = dict(slots)
        self.documents = any(s.positions is not None for s in self._slots.values())

    def stage(
        self,
        slot_id: str,
        ids: torch.Tensor,
        labels: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> None:
        """Copy `ids`, `labels` and `positions` into slot `slot_id`."""
        slot = self._slots[slot_id]
        if slot.waiting:
            raise RuntimeError(
                f"token slot {slot_id} is still waiting for its upload: the driver fed further "
                "ahead than the graph's feed window"
            )
        if slot.uploaded is not None:
            slot.uploaded.synchronize()  # its last upload has run (it has, by the invariant)
        slot.ids.copy_(ids)
        slot.labels.copy_(labels)
        if slot.positions is not None:
            assert positions is not None, "packed documents: a micro-batch without positions"
            slot.positions.copy_(positions)
        slot.waiting = True


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
