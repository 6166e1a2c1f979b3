"""Trace: JSON round trip, metrics on a hand-made three-step trace, Chrome trace export."""

import json

import pytest

from slide_ir.ir.graph import GraphInfo
from slide_ir.ir.trace import MemorySample, Span, Trace, to_chrome_trace, trace_metrics

INFO = GraphInfo(
    schedule="sliding",
    model="tiny",
    machine="m",
    batch=2,
    seq=5,
    steps=3,
    num_layers=2,
    params=1000,
    flops_per_step=7e13,
)

# One step, offsets in seconds; the head stage is layer 3. Backward: L2 then L1, each a
# recompute (0.5) + bwd (1.5); downloads 1 s, CPU updates 2 s: eta = 2 / (1 + 2).
STEP = [
    ("fwd", "gpu", 1, 0.0, 1.0),
    ("fwd", "gpu", 2, 1.0, 2.0),
    ("loss", "gpu", 3, 2.0, 3.0),
    ("recompute", "gpu", 2, 3.0, 3.5),
    ("bwd", "gpu", 2, 3.5, 5.0),
    ("recompute", "gpu", 1, 5.0, 5.5),
    ("bwd", "gpu", 1, 5.5, 7.0),
    ("d2h_grad", "d2h", 2, 5.0, 6.0),
    ("d2h_grad", "d2h", 1, 7.0, 8.0),
    ("adam", "cpu", 2, 6.0, 8.0),
    ("adam", "cpu", 1, 8.0, 10.0),
]


def _trace(steps=3) -> Trace:
    spans = tuple(
        Span(
            op_id=f"s{s}.L{layer}.{kind}",
            kind=kind,
            lane=lane,
            unit=layer,
            step=s,
            start=10.0 * (s - 1) + a,
            end=10.0 * (s - 1) + b,
        )
        for s in range(1, steps + 1)
        for kind, lane, layer, a, b in STEP
    )
    memory = (
        MemorySample(time=0.0, tier="gpu", bytes=10),
        MemorySample(time=1.0, tier="gpu", bytes=30),
        MemorySample(time=4.0, tier="gpu", bytes=20),
        MemorySample(time=0.0, tier="cpu", bytes=500),
    )
    return Trace(spans=spans, memory=memory, info=INFO, meta={"engine": "hand"})


def test_json_round_trip():
    trace = _trace()
    assert Trace.from_json(trace.to_json()) == trace


def test_unknown_version_is_refused():
    data = json.loads(_trace().to_json())
    data["version"] = 99
    with pytest.raises(ValueError, match="trace format version 99 unsupported"):
        Trace.from_json(json.dumps(data))


def test_metrics_of_a_hand_made_trace():
    m = trace_metrics(_trace())
    assert m.first_step_s == 10.0
    assert m.steady_steps == (2, 3)
    assert m.step_time_s == 10.0
    assert m.tokens_per_s == pytest.approx(10 / 10.0)
    assert m.tflops == pytest.approx(7.0)
    assert m.tflops_6n == pytest.approx(6 * 1000 * 10 / 10.0 / 1e12)
    assert (m.t_bwd_s, m.t_d2h_s, m.t_update_s) == (2.0, 1.0, 2.0)
    assert m.eta == pytest.approx(2 / 3) and m.eta_min == pytest.approx(2 / 3)
    assert m.lane_util == pytest.approx({"gpu": 0.7, "d2h": 0.2, "cpu": 0.4})
    assert m.gpu_util == pytest.approx(0.7)
    assert m.gpu_bwd_util == pytest.approx(1.0)  # from the loss at 2 to the last bwd at 7
    assert m.bottleneck == "gpu"
    assert m.peak_bytes == {"gpu": 30, "cpu": 500, "host": 500}
    assert m.compute_only_tokens_per_s == pytest.approx(10 / 7.0)


def test_one_step_trace_is_its_own_steady_state():
    m = trace_metrics(_trace(steps=1))
    assert m.steady_steps == (1,)
    assert m.step_time_s == m.first_step_s == 10.0


def test_nothing_offloaded_means_infinite_eta():
    trace = _trace()
    kept = tuple(s for s in trace.spans if s.kind != "d2h_grad")
    m = trace_metrics(Trace(spans=kept, memory=trace.memory, info=INFO))
    assert m.eta == float("inf") and m.t_d2h_s == 0.0


def test_chrome_trace_has_a_track_per_lane_and_memory_counters():
    trace = _trace()
    events = to_chrome_trace(trace)["traceEvents"]
    names = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert names == ["gpu", "d2h", "cpu"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(trace.spans)
    first = next(e for e in spans if e["name"] == "s1.L2.bwd")
    assert (first["ts"], first["dur"]) == (3.5e6, 1.5e6)
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"memory gpu (GiB)", "memory cpu (GiB)"}
    json.dumps(events)  # serialisable as is


def test_host_peak_is_pinned_plus_pageable_at_one_instant():
    from slide_ir.ir.trace import peak_bytes

    memory = [
        MemorySample(time=0.0, tier="cpu", bytes=100),
        MemorySample(time=0.0, tier="pinned", bytes=10),
        MemorySample(time=1.0, tier="pinned", bytes=50),  # host 150
        MemorySample(time=2.0, tier="pinned", bytes=0),
        MemorySample(time=2.0, tier="cpu", bytes=120),  # same instant: host 120, never 170
    ]
    assert peak_bytes(memory) == {"cpu": 120, "pinned": 50, "host": 150}
