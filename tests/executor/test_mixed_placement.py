"""Resident, streamed and sliding units in one plan (the kind of placement the default search
chooses on a fast GPU) reproduce the plain PyTorch loop in CPU mode, as the fixed placements of
test_train_equivalence.py do; shuffled lane timing changes nothing.

The tiny model has 6 units: the embedding (0), 4 decoder layers (1-4), the head (5). Counts
take units in `resident_preference` order: the first `resident` stay on the device, the next
`streamed` are updated there with their state streamed, the rest slide.
"""

from __future__ import annotations

import pytest
from runs import assert_bitwise_equal, assert_matches_reference, run_executor

from slide_ir import OpKind

CASES = {
    # embedding + layer 1 resident, layers 2-3 streamed, layer 4 + head sliding
    "untied-inputs-on-host": (
        False,
        {"resident": 2, "streamed": 2, "activations": "cpu", "cache_units": 2},
    ),
    # the embedding resident (the tied LM head's gradient lands on it), layers 1-3 streamed
    "tied-inputs-on-device": (
        True,
        {"resident": 1, "streamed": 3, "activations": "gpu", "cache_units": 3},
    ),
    # a deeper ring than sliding layers, one landing buffer, per-unit clipping in all three
    "untied-clip-deep-ring": (
        False,
        {
            "resident": 3,
            "streamed": 1,
            "activations": "cpu",
            "cache_units": 6,
            "grad_buffers": 1,
            "clip": "per-unit",
            "clip_norm": 0.05,
        },
    ),
}


def _kinds_by_layer(result) -> dict[int, set[str]]:  # type: ignore[no-untyped-def]
    out: dict[int, set[str]] = {}
    for span in result.trace.spans:
        if span.step == 1:
            out.setdefault(span.unit, set()).add(span.kind)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixed_placement_matches_pytorch_loop(case: str) -> None:
    tied, config = CASES[case]
    result = run_executor(tied, **config)
    assert_matches_reference(result, tied, config)
    # the run really had all three placements (measured spans, not the plan's word)
    kinds = _kinds_by_layer(result)
    resident, streamed = int(config["resident"]), int(config["streamed"])  # type: ignore[call-overload]
    for unit, seen in kinds.items():
        if unit < resident:
            assert OpKind.GPU_ADAM in seen and OpKind.OPT_H2D not in seen, unit
        elif unit < resident + streamed:
            assert {OpKind.GPU_ADAM, OpKind.OPT_H2D, OpKind.OPT_D2H} <= seen, unit
        else:
            assert OpKind.ADAM in seen and OpKind.GPU_ADAM not in seen, unit


def test_mixed_placement_under_random_delays_is_bitwise_equal(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tied, config = CASES["untied-inputs-on-host"]
    calm = run_executor(tied, steps=4, **config)
    monkeypatch.setenv("SLIDE_RANDOM_DELAY_MS", "3")
    monkeypatch.setenv("SLIDE_DELAY_SEED", "5")
    assert_bitwise_equal(run_executor(tied, steps=4, **config), calm)


def test_the_searched_default_matches_pytorch_loop() -> None:
    """The default placement (`fast`: the search's choice, as with no flags at all; the
    helper's own default pins `small`) trains right."""
    assert_matches_reference(run_executor(False, placement="fast"), False, {})
