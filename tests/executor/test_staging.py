"""The token staging ring: a fixed set of host buffers, a slot reused only after its upload."""

import pytest
import torch

from executor.staging import TokenStaging


def _batch(value: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, 5), value, dtype=torch.int64), torch.full(
        (2, 5), -value, dtype=torch.int64
    )


def test_slots_hold_copies_and_come_round_in_turn() -> None:
    staging = TokenStaging((2, 5), 2, cuda=False)
    ids, labels = _batch(1)
    first = staging.stage(ids, labels)
    ids.fill_(9)  # the slot holds a copy, not the caller's tensor
    assert torch.equal(first.ids, torch.full((2, 5), 1)) and torch.equal(first.labels, -first.ids)
    second = staging.stage(*_batch(2))
    assert second.ids.data_ptr() != first.ids.data_ptr()
    first.mark_uploaded()
    third = staging.stage(*_batch(3))
    assert third is first and third.ids.data_ptr() == first.ids.data_ptr()
    assert int(third.ids[0, 0]) == 3


def test_a_slot_not_yet_uploaded_is_never_overwritten() -> None:
    staging = TokenStaging((2, 5), 2, cuda=False)
    first = staging.stage(*_batch(1))
    staging.stage(*_batch(2))
    with pytest.raises(RuntimeError, match="slot 0 of 2 is still waiting"):
        staging.stage(*_batch(3))
    assert int(first.ids[0, 0]) == 1
