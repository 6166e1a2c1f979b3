"""`--gpu-memory-gb` caps torch's allocator for the run, and gives the card back after it."""

from __future__ import annotations

import types

import pytest
import torch

from slide import gpu_cap
from slide_ir.planning.compute_terms import CUDA_CONTEXT_BYTES

GIB = 1 << 30


def test_the_share_is_the_cap_less_the_context_at_most_the_card():
    assert gpu_cap.allocator_fraction(24, 80 * GIB) == (24 * GIB - CUDA_CONTEXT_BYTES) / (80 * GIB)
    assert gpu_cap.allocator_fraction(200, 80 * GIB) == 1.0
    assert gpu_cap.allocator_fraction(0.5, 80 * GIB) == 0.0  # below the context: nothing left


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's two calls, recorded: a card of 140 GiB."""
    calls: list[tuple[float, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(total_memory=140 * GIB))  # fmt: skip
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device: calls.append((fraction, device)))  # fmt: skip
    return calls


def test_a_capped_run_holds_the_cap_and_gives_the_card_back_even_on_error(fake_cuda):
    dev = torch.device("cuda", 0)
    with pytest.raises(RuntimeError), gpu_cap.capped(dev, 24):
        assert fake_cuda == [(gpu_cap.allocator_fraction(24, 140 * GIB), dev)]
        raise RuntimeError("a lane failed")
    assert fake_cuda[-1] == (1.0, dev) and len(fake_cuda) == 2


@pytest.mark.parametrize(
    "device, cap", [(torch.device("cpu"), 24.0), (torch.device("cuda", 0), None)]
)
def test_no_cap_or_no_gpu_leaves_the_allocator_alone(fake_cuda, device, cap):
    with gpu_cap.capped(device, cap):
        pass
    assert fake_cuda == []
