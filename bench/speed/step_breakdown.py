"""Where a measured step's time goes: the GPU lane's busy time per op kind, and its idle time
split by what else was running meanwhile (waiting on an upload, a download, the host's update,
the drives; nothing at all: the host issuing work), beside the compute-only time (the GPU lane
alone, back to back). One table per trace (Slide's format: `slide train --save-trace`).

    python -m bench.speed.step_breakdown TRACE.json ...

The window runs from the end of the trace's first step to the end of its last, so every step
counted is a whole steady step, its overlap with the next one included.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from slide_ir.ir.graph import lane_kind
from slide_ir.ir.trace import Span, Trace

# which lane the GPU waits on first when several run during one of its idle gaps
WAIT_ORDER = ("h2d", "d2h", "cpu", "nvme", "net")


@dataclass(frozen=True, slots=True)
class Breakdown:
    steps: int
    step_s: float  # mean wall time of a step over the window
    busy: dict[str, float]  # GPU seconds per op kind in the window
    idle: dict[str, float]  # GPU idle seconds by what ran meanwhile ("dispatch": nothing)

    @property
    def compute_only_s(self) -> float:
        """The GPU lane's own work per step: the step if nothing else ever held it up."""
        return sum(self.busy.values()) / self.steps


def breakdown(spans: tuple[Span, ...] | list[Span]) -> Breakdown:
    ends: dict[int, float] = defaultdict(float)
    for s in spans:
        ends[s.step] = max(ends[s.step], s.end)
    order = sorted(ends)
    if len(order) < 2:
        raise ValueError("a breakdown needs a trace of at least two steps")
    t0, t1 = ends[order[0]], ends[order[-1]]
    gpu = sorted((s for s in spans if s.lane == "gpu"), key=lambda s: s.start)
    others = [s for s in spans if s.lane != "gpu"]
    busy: dict[str, float] = defaultdict(float)
    for s in gpu:
        busy[s.kind] += _overlap(s.start, s.end, t0, t1)
    idle: dict[str, float] = defaultdict(float)
    cursor = t0
    for s in [*gpu, None]:
        start = t1 if s is None else min(max(s.start, t0), t1)
        if start > cursor:
            idle[_waited_on(others, cursor, start)] += start - cursor
        if s is not None:
            cursor = max(cursor, min(s.end, t1))
    return Breakdown(
        steps=len(order) - 1, step_s=(t1 - t0) / (len(order) - 1), busy=dict(busy), idle=dict(idle)
    )


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _waited_on(others: list[Span], start: float, end: float) -> str:
    """The lane kind busiest during the gap, in `WAIT_ORDER` on ties; "dispatch" when no other
    lane ran in it for more than half of it."""
    held: dict[str, float] = defaultdict(float)
    for s in others:
        held[lane_kind(s.lane)] += _overlap(s.start, s.end, start, end)
    best = max(WAIT_ORDER, key=lambda k: (held.get(k, 0.0), -WAIT_ORDER.index(k)))
    return best if held.get(best, 0.0) > 0.5 * (end - start) else "dispatch"


def table(name: str, b: Breakdown) -> str:
    wall = b.step_s * b.steps
    lines = [f"{name}: {b.steps} steps, {b.step_s * 1e3:.1f} ms a step, compute-only "
             f"{b.compute_only_s * 1e3:.1f} ms ({b.compute_only_s / b.step_s:.1%} of the step)",
             "| GPU | ms a step | share |", "|---|---|---|"]  # fmt: skip
    rows = [(f"busy: {k}", v) for k, v in sorted(b.busy.items(), key=lambda kv: -kv[1])]
    rows += [(f"idle: {k}", v) for k, v in sorted(b.idle.items(), key=lambda kv: -kv[1])]
    lines += [f"| {what} | {v / b.steps * 1e3:.1f} | {v / wall:.1%} |" for what, v in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    for path in parser.parse_args().traces:
        print(table(path.name, breakdown(Trace.from_json(path.read_text()).spans)), end="\n\n")


if __name__ == "__main__":
    main()
