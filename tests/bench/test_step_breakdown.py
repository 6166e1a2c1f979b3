"""bench/speed/step_breakdown.py against a hand-made trace."""

from __future__ import annotations

import pytest

from bench.speed import step_breakdown as sb
from slide_ir.ir.trace import Span


def _span(kind: str, lane: str, step: int, start: float, end: float) -> Span:
    return Span(op_id=f"s{step}.{kind}.{start}", kind=kind, lane=lane, unit=1, step=step,
                start=start, end=end)  # fmt: skip


def test_gpu_time_by_kind_and_its_gaps_by_what_ran():
    spans = [
        _span("fwd", "gpu", 1, 0.0, 1.0),  # step 1 ends at 1.0: the window starts there
        _span("fwd", "gpu", 2, 1.0, 2.0),
        _span("h2d_param", "h2d", 2, 2.0, 3.0),  # the GPU waits 2.0-3.0 on an upload
        _span("bwd", "gpu", 2, 3.0, 5.0),
        _span("adam", "cpu", 2, 5.0, 5.2),  # 5.0-6.0: the cpu ran 0.2 of 1.0: dispatch
        _span("bwd", "gpu", 3, 6.0, 7.0),
        _span("adam", "cpu", 3, 7.0, 9.0),  # 7.0-9.0: waiting on the cpu
    ]
    b = sb.breakdown(spans)
    assert b.steps == 2 and b.step_s == pytest.approx(4.0)  # steps end at 1, 5.2 -> 5, 9
    assert b.busy == pytest.approx({"fwd": 1.0, "bwd": 3.0})
    assert b.idle == pytest.approx({"h2d": 1.0, "dispatch": 1.0, "cpu": 2.0})
    assert b.compute_only_s == pytest.approx(2.0)
    assert "compute-only 2000.0 ms (50.0% of the step)" in sb.table("t", b)


def test_one_step_is_refused():
    with pytest.raises(ValueError, match="at least two steps"):
        sb.breakdown([_span("fwd", "gpu", 1, 0.0, 1.0)])
