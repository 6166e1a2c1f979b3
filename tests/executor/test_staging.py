"""The host token slots: fixed host buffers the driver stages each micro-batch in, in the slot
its embedding's forward reads, a slot restaged only after its upload."""

import pytest
import torch

from executor.staging import TokenSlot, TokenStaging


def _batch(value: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, 5), value, dtype=torch.int64), torch.full(
        (2, 5), -value, dtype=torch.int64
    )


def _slots(n: int, documents: bool = False) -> dict[str, TokenSlot]:
    fields = 3 if documents else 2
    out = {}
    for k in range(n):
        t = torch.zeros((fields, 2, 5), dtype=torch.int64)
        out[f"pinned_tokens.{k}"] = TokenSlot(t[0], t[1], t[2] if documents else None, None)
    return out


def test_a_slot_holds_a_copy_of_what_is_staged_in_it() -> None:
    slots = _slots(2)
    staging = TokenStaging(slots)
    ids, labels = _batch(1)
    staging.stage("pinned_tokens.1", ids, labels)
    ids.fill_(9)  # the slot holds a copy, not the caller's tensor
    second = slots["pinned_tokens.1"]
    assert torch.equal(second.ids, torch.full((2, 5), 1)) and torch.equal(
        second.labels, -second.ids
    )
    assert int(slots["pinned_tokens.0"].ids.abs().sum()) == 0  # the other slot untouched
    assert not staging.documents and TokenStaging(_slots(1, documents=True)).documents
    second.mark_uploaded()
    staging.stage("pinned_tokens.1", *_batch(3))
    assert int(second.ids[0, 0]) == 3


def test_a_slot_not_yet_uploaded_is_never_overwritten() -> None:
    slots = _slots(2)
    staging = TokenStaging(slots)
    staging.stage("pinned_tokens.0", *_batch(1))
    staging.stage("pinned_tokens.1", *_batch(2))
    with pytest.raises(RuntimeError, match=r"token slot pinned_tokens.0 is still waiting"):
        staging.stage("pinned_tokens.0", *_batch(3))
    assert int(slots["pinned_tokens.0"].ids[0, 0]) == 1
