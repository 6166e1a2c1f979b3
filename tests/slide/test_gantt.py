"""Gantt charts of measured runs say what they show: a first step of one-time warm-up is left
out and named, a CPU-mode run's compute and buffers are labelled as the host's, and the host
panel is pinned + pageable RAM, the figure `slide plan` and `slide simulate` print."""

import pytest

from slide import gantt
from slide_ir.ir.graph import GraphInfo
from slide_ir.ir.trace import MemorySample, Span, Trace

GIB = 2**30
INFO = GraphInfo(schedule="sliding", model="m", machine="auto (cpu)", batch=1, seq=8, steps=3,
                 num_layers=1, params=10, flops_per_step=1.0)  # fmt: skip


def measured(step_seconds, device="cpu"):
    """One gpu-lane span per step, back to back, as the executor records them."""
    spans, t = [], 0.0
    for step, took in enumerate(step_seconds, start=1):
        spans.append(Span(op_id=f"s{step}.L1.fwd", kind="fwd", lane="gpu", unit=1, step=step,
                          start=t, end=t + took))  # fmt: skip
        t += took
    memory = (
        MemorySample(time=0.0, tier="gpu", bytes=2 * 2**20),
        MemorySample(time=0.0, tier="pinned", bytes=GIB),
        MemorySample(time=0.0, tier="cpu", bytes=0),
        MemorySample(time=t, tier="cpu", bytes=2 * GIB),
    )
    meta = {"engine": "executor", "device": device}
    return Trace(spans=tuple(spans), memory=memory, info=INFO, meta=meta)


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """The figure plot_gantt would save: its axes' titles, tick labels, y labels and texts."""
    seen = {}

    def keep(fig, path):
        axes = fig.axes
        seen["title"] = axes[0].get_title()
        seen["xlim"] = axes[0].get_xlim()
        seen["lanes"] = [t.get_text() for t in axes[0].get_yticklabels()]
        seen["ylabels"] = [a.get_ylabel() for a in axes[1:] if a.get_ylabel()]
        seen["texts"] = [t.get_text() for a in axes for t in a.texts]
        return path

    monkeypatch.setattr(gantt, "_save", keep)
    return lambda trace: (gantt.plot_gantt(trace, tmp_path / "g.png"), seen)[1]


def test_a_warm_up_first_step_is_left_out_and_named(drawn):
    seen = drawn(measured([13.5, 0.1, 0.1]))
    assert "step 1 left out: 13.5 s" in seen["title"] and "AdamW kernel" in seen["title"]
    assert seen["xlim"][0] == pytest.approx(13.5)
    seen = drawn(measured([0.15, 0.1, 0.1]))  # an ordinary first step stays in the picture
    assert "left out" not in seen["title"] and seen["xlim"][0] == 0.0


def test_cpu_mode_is_labelled_as_the_host(drawn):
    seen = drawn(measured([0.1, 0.1]))
    assert seen["lanes"] == ["compute\n(on the CPU)"]
    assert seen["ylabels"][0].startswith("device buffers\n(host RAM, CPU mode)")
    assert "peak 0.00195 GiB" in seen["texts"]  # 2 MiB, not "0.00"
    assert drawn(measured([0.1, 0.1], device="NVIDIA H200"))["lanes"] == ["gpu"]


def test_the_host_panel_is_pinned_plus_pageable(drawn):
    seen = drawn(measured([0.1, 0.1]))
    assert seen["ylabels"][1] == "host\nGiB" and "peak 3 GiB" in seen["texts"]
