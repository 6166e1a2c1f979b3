"""bench/memory/capacity_plot.py: the data behind the capacity-against-RAM plot."""

from __future__ import annotations

from bench.memory import capacity_plot as cp


def _family(params: int, base: str, layers: int) -> dict[str, object]:
    return {"scaled_params": params, "scaled_from": base, "scaled_layers": layers}


def test_the_larger_family_is_taken_and_others_are_ignored():
    result = {"families": {"llama-3.1": _family(20, "llama-3.1-8b", 89),
                           "qwen2.5": _family(30, "qwen2.5-14b", 105),
                           "mistral-large": _family(99, "mistral-large-2", 13)}}  # fmt: skip
    best = cp.largest_scaled(result)
    assert best == {"params": 30, "family": "qwen2.5", "scaled_from": "qwen2.5-14b", "layers": 105}
    assert cp.largest_scaled(result, ("llama-3.1",))["params"] == 20


def test_points_grow_with_ram_and_bf16_moments_fit_at_least_fp32():
    modes = {k: cp.MODES[k] for k in list(cp.MODES)[:2]}  # optimizer in RAM, FP32 and BF16
    rows = cp.curve_points("paper-pc-4090", 1, (64, 128), modes)
    by = {(r["mode"], r["ram_gib"]): r for r in rows}
    assert len(rows) == 4
    for label in modes:
        assert by[(label, 128)]["params"] > by[(label, 64)]["params"] > 0
        assert by[(label, 64)]["family"] in cp.FAMILIES
    fp32, bf16 = list(modes)
    for ram in (64, 128):
        assert by[(bf16, ram)]["params"] >= by[(fp32, ram)]["params"]


def test_global_clipping_never_fits_more_than_none():
    """The train default's curve: the held gradients cost RAM, never capacity gained."""
    modes = {k: v for k, v in cp.MODES.items() if v[0] == "nvme"}
    rows = cp.curve_points("paper-pc-4090", 1, (128,), modes)
    (bare, clipped) = (r for r in rows)
    assert modes[bare["mode"]][2] == "none" and modes[clipped["mode"]][2] == "global"
    assert 0 < clipped["params"] < bare["params"]
