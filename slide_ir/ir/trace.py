"""Trace: what happened (or is predicted to happen) when a Graph ran, and the metrics read from it.

One format for the simulator's predictions and the executor's measurements, so one metrics
function, one Gantt chart and one Chrome-trace exporter serve both:

- `Span`: one op's execution on its lane, `start`/`end` in seconds from the run's origin;
- `MemorySample`: bytes held on a tier from `time` until the tier's next sample (a step function);
- `Trace`: spans + samples + the graph's `GraphInfo` + free-form `meta` (engine, cost model, ...).

Metrics take the steady state from steps >= 2 (step 1 starts with empty pipelines and is reported
on its own). Step boundaries are step *ends*: step s lasts from the end of its last op of step s-1
to the end of its last op, so overlapping steps (step s+1's forward waiting on step s's last
updates) are timed by their period, as a throughput measurement would.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from slide_ir.ir.graph import Graph, GraphInfo, Op, info_from_dict, lane_kind, load_versioned

TRACE_VERSION = 1
# GPU work that is model compute (what a compute-only run would still do).
COMPUTE_KINDS = frozenset({"fwd", "recompute", "bwd", "loss"})
BWD_KINDS = frozenset({"recompute", "bwd"})  # T_bwd of a layer: its recompute + backward
UPDATE_KINDS = frozenset({"adam", "cast"})  # T_update of a layer: CPU AdamW (+ a separate cast)
BACKWARD_PHASE_KINDS = frozenset({"loss", "recompute", "bwd"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Span:
    op_id: str
    kind: str
    lane: str
    unit: int
    step: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    @classmethod
    def of(cls, op: Op, start: float, end: float) -> Span:
        """The span of one op: both engines record them this way."""
        return cls(op_id=op.id, kind=str(op.kind), lane=op.lane, unit=op.unit, step=op.step,
                   start=start, end=end)  # fmt: skip


def _span_from_dict(d: dict[str, Any]) -> Span:
    """A saved span; traces written before ops had units call the field `layer`."""
    if "layer" in d:
        d = {**{k: v for k, v in d.items() if k != "layer"}, "unit": d["layer"]}
    return Span(**d)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemorySample:
    time: float
    tier: str
    bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Trace:
    spans: tuple[Span, ...]
    memory: tuple[MemorySample, ...]
    info: GraphInfo
    meta: Mapping[str, object] = field(default_factory=dict)

    def lanes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.lane for s in self.spans))

    def steps(self) -> tuple[int, ...]:
        return tuple(sorted({s.step for s in self.spans}))

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": TRACE_VERSION,
                "info": asdict(self.info),
                "meta": dict(self.meta),
                "spans": [asdict(s) for s in self.spans],
                "memory": [asdict(m) for m in self.memory],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Trace:
        data = load_versioned(text, TRACE_VERSION, "trace")
        return cls(
            spans=tuple(_span_from_dict(s) for s in data["spans"]),
            memory=tuple(MemorySample(**m) for m in data["memory"]),
            info=info_from_dict(data["info"]),
            meta=data.get("meta", {}),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Metrics:
    """Figures read from one trace. Times in seconds; `*_util` in [0, 1]."""

    first_step_s: float
    step_time_s: float  # mean over the steps after the trace's first; that one if it is alone
    steady_steps: tuple[int, ...]
    tokens_per_s: float
    tflops: float  # model TFLOP/s from GraphInfo.flops_per_step (6N-style plus attention)
    tflops_6n: float  # 6 N per token
    tflops_8n: float  # 8 N per token: counts the recompute forward as well
    lane_util: Mapping[str, float]
    gpu_util: float
    gpu_bwd_util: float  # GPU busy share in the backward phase of the steady steps
    eta: float  # mean T_bwd / (mean T_d2h + mean T_update); inf if nothing is offloaded
    eta_min: float  # worst single (step, layer)
    t_bwd_s: float
    t_d2h_s: float
    t_update_s: float
    bottleneck: str  # lane bounding the step (critical path when a graph is given)
    critical_path: Mapping[str, float]  # seconds per lane on the critical path, per steady step
    peak_bytes: Mapping[str, int]  # per trace tier, plus `host` = pinned + cpu together
    compute_only_tokens_per_s: float  # the same GPU compute with zero-cost transfers and updates


def trace_metrics(trace: Trace, graph: Graph | None = None) -> Metrics:
    """Metrics of a trace; with its graph, the bottleneck comes from the critical path."""
    if not trace.spans:
        raise ValueError("trace has no spans")
    steps = trace.steps()
    ends = _step_ends(trace.spans)
    t0 = min(s.start for s in trace.spans)
    steady = steps[1:] or steps[:1]  # the first step traced is the warm-up (or a boundary)
    lo = ends.get(steady[0] - 1, t0)
    hi = ends[steady[-1]]
    if not hi > lo:
        raise ValueError("the steady steps take no time: nothing to measure")
    step_time = (hi - lo) / len(steady)
    info = trace.info
    tokens = info.tokens_per_step
    # min(): float sums of back-to-back spans can exceed the window by an ulp
    util = {lane: min(1.0, _busy(trace.spans, lane, lo, hi) / (hi - lo)) for lane in trace.lanes()}
    terms = _eta_terms(trace.spans, set(steady), info.num_layers)
    path = critical_path(trace, graph, lo, hi) if graph is not None else {}
    path = {lane: t / len(steady) for lane, t in path.items()}  # per step
    return Metrics(
        first_step_s=ends[steps[0]] - t0,
        step_time_s=step_time,
        steady_steps=steady,
        tokens_per_s=tokens / step_time,
        tflops=info.flops_per_step / step_time / 1e12,
        tflops_6n=6 * info.params * tokens / step_time / 1e12,
        tflops_8n=8 * info.params * tokens / step_time / 1e12,
        lane_util=util,
        gpu_util=util.get("gpu", 0.0),
        gpu_bwd_util=_backward_util(trace.spans, set(steady)),
        **terms,
        bottleneck=_bottleneck(path, util),
        critical_path=path,
        peak_bytes=peak_bytes(trace.memory),
        compute_only_tokens_per_s=_compute_only(trace.spans, steady, tokens),
    )


def _step_ends(spans: Iterable[Span]) -> dict[int, float]:
    ends: dict[int, float] = {}
    for s in spans:
        ends[s.step] = max(ends.get(s.step, s.end), s.end)
    return ends


def _busy(spans: Iterable[Span], lane: str, lo: float, hi: float) -> float:
    """Busy seconds of `lane` inside [lo, hi] (a lane runs one op at a time: no overlap)."""
    return sum(max(0.0, min(s.end, hi) - max(s.start, lo)) for s in spans if s.lane == lane)


def _eta_terms(spans: Sequence[Span], steady: set[int], num_layers: int) -> dict[str, float]:
    """eta from the steady steps' decoder layers that are offloaded (have a d2h_grad).

    Per (step, layer): T_bwd = its `recompute` + `bwd` spans, T_d2h = its `d2h_grad` spans,
    T_update = its `adam` (+ `cast`) spans. Resident layers (updated on the GPU) have no
    d2h_grad and are left out; the embedding and head stages are not decoder layers and are too.
    """
    terms: dict[tuple[int, int], list[float]] = {}
    for s in spans:
        if s.step not in steady or not 1 <= s.unit <= num_layers:
            continue
        t = terms.setdefault((s.step, s.unit), [0.0, 0.0, 0.0])
        if s.kind in BWD_KINDS:
            t[0] += s.duration
        elif s.kind == "d2h_grad":
            t[1] += s.duration
        elif s.kind in UPDATE_KINDS:
            t[2] += s.duration
    rows = [t for t in terms.values() if t[1] > 0 and t[0] > 0]
    if not rows:
        inf = float("inf")
        return {"eta": inf, "eta_min": inf, "t_bwd_s": 0.0, "t_d2h_s": 0.0, "t_update_s": 0.0}
    n = len(rows)
    bwd, d2h, upd = (sum(r[i] for r in rows) / n for i in range(3))
    return {
        "eta": bwd / (d2h + upd),
        "eta_min": min(r[0] / (r[1] + r[2]) for r in rows),
        "t_bwd_s": bwd,
        "t_d2h_s": d2h,
        "t_update_s": upd,
    }


def _backward_util(spans: Sequence[Span], steady: set[int]) -> float:
    """GPU busy share from the first backward-phase GPU op to the last one, per steady step."""
    busy = total = 0.0
    for step in steady:
        phase = [
            s
            for s in spans
            if s.step == step and s.lane == "gpu" and s.kind in BACKWARD_PHASE_KINDS
        ]
        if not phase:
            continue
        lo, hi = min(s.start for s in phase), max(s.end for s in phase)
        busy += _busy(spans, "gpu", lo, hi)
        total += hi - lo
    return min(1.0, busy / total) if total > 0 else 0.0


def _compute_only(spans: Sequence[Span], steady: Sequence[int], tokens: int) -> float:
    """Tokens/s if the GPU only ran its model compute back to back (no waits, no updates)."""
    compute = sum(s.duration for s in spans if s.step in steady and s.kind in COMPUTE_KINDS)
    return tokens * len(steady) / compute if compute > 0 else 0.0


def _bottleneck(path: Mapping[str, float], util: Mapping[str, float]) -> str:
    lanes = {lane: t for lane, t in path.items() if lane != "wait"} or dict(util)
    return max(lanes, key=lambda lane: lanes[lane]) if lanes else ""


def trace_violations(trace: Trace, graph: Graph, tolerance_s: float = 0.0) -> list[str]:
    """Where a trace breaks its graph's rules, both engines' rule: an op starts only after each
    of its dependencies ended, and a lane runs its ops one at a time in list order. Ops the
    trace does not hold (outside an executor's trace window) are skipped. `tolerance_s`
    absorbs clock skew between host and device timestamps; [] means the trace obeys."""
    spans = {s.op_id: s for s in trace.spans}
    ops = {op.id: op for op in graph.ops}
    problems = [f"{i} is not an op of the graph" for i in spans if i not in ops]
    for op_id, span in spans.items():
        for dep in ops[op_id].deps if op_id in ops else ():
            if dep in spans and span.start < spans[dep].end - tolerance_s:
                problems.append(f"{op_id} started at {span.start:.6f} s, before its "
                                f"dependency {dep} ended at {spans[dep].end:.6f} s")  # fmt: skip
    for lane in graph.lanes():
        ran = [spans[op.id] for op in graph.lane_ops(lane) if op.id in spans]
        for a, b in itertools.pairwise(ran):
            if b.start < a.end - tolerance_s:
                problems.append(f"{b.op_id} started at {b.start:.6f} s on lane {lane} before "
                                f"{a.op_id}, ahead of it there, ended at {a.end:.6f} s")  # fmt: skip
    return problems


def peak_bytes(memory: Iterable[MemorySample]) -> dict[str, int]:
    """Peak per tier, plus `host`: the peak of pinned + pageable together (the ledger's `cpu`),
    which is not the sum of their separate peaks."""
    samples = sorted(memory, key=lambda m: m.time)
    out: dict[str, int] = {}
    now = {"pinned": 0, "cpu": 0}
    for i, m in enumerate(samples):
        out[m.tier] = max(out.get(m.tier, 0), m.bytes)
        if m.tier in now:
            now[m.tier] = m.bytes
            last_at_instant = i + 1 == len(samples) or samples[i + 1].time != m.time
            if last_at_instant:
                out["host"] = max(out.get("host", 0), now["pinned"] + now["cpu"])
    return out


def critical_path(trace: Trace, graph: Graph, lo: float, hi: float) -> dict[str, float]:
    """Seconds per lane on the critical path inside [lo, hi].

    Walk back from the last op to end: each op was gated by whichever predecessor (dependency
    or lane predecessor) ended last. Gaps between that end and the op's start (launch delays in
    a measured trace) are counted as `wait`.
    """
    spans = {s.op_id: s for s in trace.spans}
    preds = _gating_predecessors(graph)
    cur: Span | None = max(trace.spans, key=lambda s: s.end)
    out: dict[str, float] = {}
    while cur is not None and cur.end > lo:
        out[cur.lane] = out.get(cur.lane, 0.0) + min(cur.end, hi) - max(cur.start, lo)
        before = [spans[p] for p in preds.get(cur.op_id, ()) if p in spans]
        nxt = max(before, key=lambda s: s.end, default=None)
        gap_end = cur.start
        gap_start = nxt.end if nxt is not None else lo
        if gap_end > gap_start and gap_end > lo:
            out["wait"] = out.get("wait", 0.0) + gap_end - max(gap_start, lo)
        cur = nxt
    return {lane: t for lane, t in out.items() if t > 0}


def _gating_predecessors(graph: Graph) -> dict[str, tuple[str, ...]]:
    preds: dict[str, tuple[str, ...]] = {}
    last: dict[str, str] = {}
    for op in graph.ops:
        prev = last.get(op.lane)
        preds[op.id] = op.deps + ((prev,) if prev else ())
        last[op.lane] = op.id
    return preds


# -- Chrome trace (Perfetto) --------------------------------------------------------------------
def to_chrome_trace(trace: Trace) -> dict[str, object]:
    """Chrome trace-event JSON: one thread track per lane, one counter track per memory tier."""
    lanes = sorted(trace.lanes(), key=_lane_order)
    tid = {lane: i + 1 for i, lane in enumerate(lanes)}
    events: list[dict[str, object]] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": _title(trace.info)}}
    ]
    for lane in lanes:
        events.append(
            {"ph": "M", "pid": 1, "tid": tid[lane], "name": "thread_name", "args": {"name": lane}}
        )
        events.append(
            {
                "ph": "M",
                "pid": 1,
                "tid": tid[lane],
                "name": "thread_sort_index",
                "args": {"sort_index": tid[lane]},
            }
        )
    events.extend(_span_event(s, tid[s.lane]) for s in trace.spans)
    events.extend(
        {
            "ph": "C",
            "pid": 1,
            "name": f"memory {m.tier} (GiB)",
            "ts": m.time * 1e6,
            "args": {"GiB": m.bytes / 2**30},
        }
        for m in trace.memory
    )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(trace.meta)}


def _span_event(s: Span, tid: int) -> dict[str, object]:
    return {
        "ph": "X",
        "pid": 1,
        "tid": tid,
        "name": s.op_id,
        "cat": s.kind,
        "ts": s.start * 1e6,
        "dur": s.duration * 1e6,
        "args": {"kind": s.kind, "unit": s.unit, "step": s.step},
    }


def _lane_order(lane: str) -> tuple[int, str]:
    order = {"gpu": 0, "h2d": 1, "d2h": 2, "cpu": 3, "nvme": 4}
    return (order.get(lane_kind(lane), 9), lane)


def lane_order(lanes: Iterable[str]) -> list[str]:
    """Lanes in display order: gpu, h2d, d2h, cpu, nvme0..k."""
    return sorted(lanes, key=_lane_order)


def _title(info: GraphInfo) -> str:
    return f"{info.schedule}: {info.model} on {info.machine}, batch {info.batch} x seq {info.seq}"
