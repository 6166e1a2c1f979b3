"""What a run keeps of its timing and memory: bounded, whatever the number of steps.

Lanes hand each finished op to the `Recorder` (op, start mark, end mark: host clock floats, or
CUDA events on GPU lanes). The main thread resolves every step once its ops are done, at most a
step behind: each op's duration is added to its lane's running busy time, and its span is kept
only when its step lies in the trace window (`--trace-steps`, default the first steps). So the
entries (and CUDA events) alive at any moment are those of the step or two in flight, and the
spans kept are the window's. `MemoryLog` does the same for memory samples: the window's, plus
the highest sample of each tier over the whole run. `RecentValues` keeps the last losses and
learning rates in storage allocated once, so the host memory a run holds stops growing after
its first step, not after its ten-thousandth.
"""

from __future__ import annotations

import array
import threading
import time
from dataclasses import dataclass, replace

import torch

from slide_ir.ir.graph import Op
from slide_ir.ir.trace import MemorySample, Span

DEFAULT_TRACE_STEPS = (1, 4)  # step 1 (warm-up) and the first steady steps, for Gantt charts


def default_trace_steps(steps: int, checked_after: int | None) -> tuple[int, int]:
    """DEFAULT_TRACE_STEPS, or for a run that checks its placement after step `checked_after`
    (re-planning) the four steps just after the check where the run has them: the trace and
    its Gantt chart then show the placement the run went on with."""
    if checked_after is None or steps < checked_after + 4:
        return DEFAULT_TRACE_STEPS
    return checked_after + 1, checked_after + 4


@dataclass(frozen=True, slots=True)
class StepWindow:
    """Steps first..last (1-based, inclusive, counted from this run's first step)."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if not 1 <= self.first <= self.last:
            raise ValueError(
                f"trace steps must be A:B with 1 <= A <= B, got {self.first}:{self.last}"
            )

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last


class RecentValues:
    """The last `capacity` floats appended, in a ring allocated (and touched) up front."""

    def __init__(self, capacity: int) -> None:
        self._ring = array.array("d", [0.0]) * capacity
        self._count = 0

    def append(self, value: float) -> None:
        self._ring[self._count % len(self._ring)] = value
        self._count += 1

    def values(self) -> list[float]:
        """Oldest first."""
        n = len(self._ring)
        if self._count <= n:
            return self._ring[: self._count].tolist()
        cut = self._count % n
        return (self._ring[cut:] + self._ring[:cut]).tolist()


class Recorder:
    """Finished ops from the lanes, resolved step by step (see the module docstring). The
    graph of a run is repeated (`offset` is the steps run before the current repetition), so
    kept spans are renamed to their step within the run: `s3.L5.fwd` of the second repetition
    of a 64-step graph is `s67.L5.fwd`."""

    def __init__(self, cuda: bool, window: StepWindow) -> None:
        self._lock = threading.Lock()
        self._raw: list[tuple[int, Op, object, object]] = []
        self.window, self.offset = window, 0
        self.spans: list[Span] = []
        self.busy: dict[str, float] = {}  # lane -> seconds of op time, the whole run
        self._steady: dict[str, float] = {}  # the same from step 2 on (no warm-up)
        self._steady_kinds: dict[str, float] = {}  # op kind -> seconds, from step 2 on
        self.t0 = time.perf_counter()
        self.origin: torch.cuda.Event | None = None
        if cuda:
            torch.cuda.synchronize()
            self.origin = torch.cuda.Event(enable_timing=True)
            self.origin.record()
            self.t0 = time.perf_counter()

    def put(self, op: Op, start: object, end: object) -> None:
        with self._lock:
            self._raw.append((self.offset + op.step, op, start, end))

    def _seconds(self, mark: object) -> float:
        if isinstance(mark, float):
            return mark - self.t0
        assert self.origin is not None and isinstance(mark, torch.cuda.Event)
        return self.origin.elapsed_time(mark) / 1e3

    def resolve(self, upto: int) -> None:
        """Account for every entry of steps <= upto (their ops, device work included, must
        have finished); entries of later steps stay."""
        with self._lock:
            ready = [e for e in self._raw if e[0] <= upto]
            self._raw = [e for e in self._raw if e[0] > upto]
        for step, op, a, b in ready:
            start, end = self._seconds(a), self._seconds(b)
            self.busy[op.lane] = self.busy.get(op.lane, 0.0) + (end - start)
            if step >= 2:
                self._steady[op.lane] = self._steady.get(op.lane, 0.0) + (end - start)
                self._steady_kinds[op.kind] = self._steady_kinds.get(op.kind, 0.0) + (end - start)
            if step in self.window:
                span = Span.of(op, start, end)
                self.spans.append(replace(span, step=step, op_id=_renumbered(op.id, step)))

    def steady_busy(self) -> dict[str, float]:
        """Seconds of op time per lane over the steps resolved from step 2 on."""
        return dict(self._steady)

    def steady_busy_by_kind(self) -> dict[str, float]:
        """Seconds of op time per op kind over the steps resolved from step 2 on."""
        return dict(self._steady_kinds)

    def pending(self) -> int:
        with self._lock:
            return len(self._raw)

    def window_spans(self) -> tuple[Span, ...]:
        return tuple(sorted(self.spans, key=lambda s: (s.start, s.end)))


class Unrecorded(Recorder):
    """The recorder of passes whose spans nobody reads: an eval pass's (its time is the wall
    clock's, in the eval's figures), kept out of the trace, the lanes' busy shares and the
    re-fit's measurements."""

    def put(self, op: Op, start: object, end: object) -> None:
        return


def _renumbered(op_id: str, step: int) -> str:
    head, _, rest = op_id.partition(".")
    return f"s{step}.{rest}" if head.startswith("s") and head[1:].isdigit() else op_id


class MemoryLog:
    """Memory samples of the window's steps, and each tier's highest sample of the run."""

    def __init__(self, window: StepWindow, at_start: list[MemorySample]) -> None:
        self.window = window
        self.samples = list(at_start)
        self.peaks: dict[str, MemorySample] = {}

    def add(self, step: int, samples: list[MemorySample]) -> None:
        for s in samples:
            if s.tier not in self.peaks or s.bytes > self.peaks[s.tier].bytes:
                self.peaks[s.tier] = s
        if step in self.window:
            self.samples.extend(samples)

    def all(self) -> tuple[MemorySample, ...]:
        extra = [s for s in self.peaks.values() if s not in self.samples]
        return tuple(sorted(self.samples + extra, key=lambda s: s.time))
