"""Autograd tapes a layer's forward keeps for its backward (no recompute: `TrainConfig.
keep_activations`).

Such a tape outlives the slots its forward read. The layer's input slot is reused at once, so
the forward records a copy of the input. Its cache-unit slot may hold other layers before the
backward, which finds the layer's weights wherever the graph uploaded them again; so saved
tensors that are views of the unit's weights are packed as (offset, size, stride) and unpacked
against the weights the backward reads (`Tape.weights`, set by the backward). Saved weights are
never copied (they are the unit's bytes, not the tape's, and `ledger`'s tape term leaves them
out), and autograd's version check does not see the slot's reuse. Everything else the forward
saves is kept as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class _WeightView:
    offset: int  # elements from the start of the unit's flat weights
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(kw_only=True, slots=True)
class Tape:
    """A layer's forward with autograd recording: the backward's root
    (`layers.decoder_layer_taped`), the input leaf and the parameter leaves."""

    weights: torch.Tensor  # the unit's flat weights: the forward's slot, then the backward's
    root: torch.Tensor | None = None
    x: torch.Tensor | None = None
    leaves: dict[str, torch.Tensor] = field(default_factory=dict)

    def pack(self, t: torch.Tensor) -> Any:
        w = self.weights
        if t.device != w.device or t.untyped_storage().data_ptr() != w.untyped_storage().data_ptr():
            return t
        return _WeightView(t.storage_offset() - w.storage_offset(), tuple(t.size()), t.stride())

    def unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _WeightView):
            return packed  # type: ignore[no-any-return]
        w = self.weights
        return w.as_strided(packed.size, packed.stride, w.storage_offset() + packed.offset)

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
