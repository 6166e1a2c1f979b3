"""Resident, streamed and sliding units in one plan (the kind of placement the default search
chooses on a fast GPU) reproduce the plain PyTorch loop in CPU mode, as the fixed placements of
test_train_equivalence.py do; shuffled lane timing changes nothing.

The tiny model has 6 units: the embedding (0), 4 decoder layers (1-4), the head (5). Counts
take units in `resident_preference` order: the first `resident` stay on the device, the next
`streamed` are updated there with their state streamed, the rest slide.
"""

from __future__ import annotations

import pytest
from runs import STEPS, assert_bitwise_equal, max_rel_error, reference, run_executor

from slide_ir import OpKind

RTOL = 1e-5  # as test_train_equivalence.py: observed ~1e-6 (fused q/k/v, gate/up matmuls)

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
            out.setdefault(span.layer, set()).add(span.kind)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixed_placement_matches_pytorch_loop(case: str) -> None:
    tied, config = CASES[case]
    clip = float(config["clip_norm"]) if config.get("clip") == "per-unit" else None  # type: ignore[arg-type]
    ref_losses, ref_state = reference(tied, 1, clip)
    result = run_executor(tied, **config)
    assert result.steps_done == STEPS
    for step, (ours, want) in enumerate(zip(result.losses, ref_losses, strict=True), 1):
        assert abs(ours - want) <= RTOL * abs(want), f"step {step}: loss {ours} vs {want}"
    err, name = max_rel_error(result.final_state, ref_state)
    assert err <= RTOL, f"{name}: relative error {err:.2e}"
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
    """No placement flags at all: whatever the search chooses for this model trains right."""
    ref_losses, ref_state = reference(False, 1)
    result = run_executor(False)
    for ours, want in zip(result.losses, ref_losses, strict=True):
        assert abs(ours - want) <= RTOL * abs(want)
    err, name = max_rel_error(result.final_state, ref_state)
    assert err <= RTOL, f"{name}: relative error {err:.2e}"
