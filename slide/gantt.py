"""Pictures of traces and sweeps (matplotlib, Agg: files only, no display needed).

`plot_gantt` draws any `Trace`, predicted or measured, the same way: one row per lane (gpu, h2d,
d2h, cpu, nvme0..k), ops coloured by kind, layer numbers on bars wide enough to hold them, the
steady-state step shaded, and below it one memory-over-time panel per tier: gpu, host (pinned
and pageable together, the figure `slide plan` and `slide simulate` print as CPU; the pinned part
drawn darker) and nvme, all in GiB. Deep models (88 layers x 9 ops x 3 steps) are unreadable in
full, so by default a trace of more than `ZOOM_LAYERS` decoder layers is zoomed to its first
steady step (`zoom="all"` draws everything). A measured first step that took more than
`WARMUP_FACTOR` steady steps (the one-time host AdamW kernel build, allocator and library
warm-up) would squeeze every other step into a sliver, so "auto" leaves it out and the title says
how long it took. A CPU-mode run (the executor without CUDA) computes on the host: its lanes and
memory panels say so rather than "gpu".

`plot_sweep` draws throughput against a swept variable, with the compute-only peak and eta.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from slide_ir.ir.trace import Span, Trace, lane_order

ZOOM_LAYERS = 32
WARMUP_FACTOR = 3.0
GIB = 2**30
KIND_COLOURS = {
    "fwd": "#4c72b0",
    "recompute": "#8fa8d8",
    "bwd": "#dd8452",
    "loss": "#937860",
    "h2d_param": "#55a868",
    "act_load": "#a6d8a0",
    "d2h_grad": "#c44e52",
    "act_save": "#f0a0a0",
    "adam": "#8172b3",
    "gpu_adam": "#b07cc6",
    "opt_h2d": "#2e7d4f",
    "opt_d2h": "#8c2d30",
    "w_d2h": "#e07b7d",
    "cast": "#c9b3e6",
    "grad_accum": "#da8bc3",
    "nvme_read": "#ccb974",
    "nvme_write": "#64b5cd",
    "reduce_scatter": "#2b2b2b",  # the net lane's collectives (data-parallel ranks)
    "all_gather": "#8c8c8c",
    "all_reduce": "#5a5a5a",
}
TIER_ORDER = ("gpu", "host", "nvme")


def step_window(trace: Trace, step: int) -> tuple[float, float]:
    """[end of step-1, end of step]: the period a step occupies."""
    ends: dict[int, float] = {}
    for s in trace.spans:
        ends[s.step] = max(ends.get(s.step, s.end), s.end)
    if step not in ends:
        raise ValueError(f"step must be one of {sorted(ends)}, got {step}")
    start = ends.get(step - 1, min(s.start for s in trace.spans))
    return start, ends[step]


def _steady_step(trace: Trace) -> int:
    steps = trace.steps()
    return next((s for s in steps if s >= 2), steps[0])


def plot_gantt(
    trace: Trace,
    path: str | Path,
    *,
    zoom: str | int = "auto",
    title: str | None = None,
) -> Path:
    """Write a Gantt chart of `trace` to `path` (PNG, SVG, PDF by suffix).

    `zoom`: "all" (whole run), a step number, or "auto" (the first steady step for deep models).
    """
    steady = _steady_step(trace)
    if zoom == "auto":
        zoom = steady if trace.info.num_layers > ZOOM_LAYERS and len(trace.steps()) > 1 else "all"
    warmup = _warmup_left_out(trace) if zoom == "all" else None
    if zoom != "all":
        lo, hi = step_window(trace, int(zoom))
    elif warmup is not None:
        lo, hi = step_window(trace, warmup[0] + 1)[0], max(s.end for s in trace.spans)
    else:
        lo, hi = min(s.start for s in trace.spans), max(s.end for s in trace.spans)
    memory = tier_samples(trace)
    tiers = [t for t in TIER_ORDER if t in memory]
    fig, axes = plt.subplots(
        1 + len(tiers),
        1,
        sharex=True,
        figsize=(16, 3.2 + 1.1 * len(tiers) + 0.35 * len(trace.lanes())),
        gridspec_kw={"height_ratios": [max(2, len(trace.lanes()))] + [1.2] * len(tiers)},
        squeeze=False,
    )
    _draw_lanes(axes[0][0], trace, lo, hi, fig, on_host=on_host(trace))
    if len(trace.steps()) > 1:
        a, b = step_window(trace, steady)
        for row in axes:
            row[0].axvspan(a, b, color="#999999", alpha=0.12, zorder=0)
        axes[0][0].text(a, -0.6, f" steady step {steady}", va="bottom", fontsize=8, color="#555")
    for ax_row, tier in zip(axes[1:], tiers, strict=True):
        _draw_memory(ax_row[0], memory[tier], _tier_label(tier, on_host(trace)), hi)
    axes[-1][0].set_xlabel("time (s)")
    axes[-1][0].set_xlim(lo, hi)
    info = trace.info
    axes[0][0].set_title(
        title
        or f"{info.schedule}: {info.model} on {info.machine}, batch {info.batch} x seq {info.seq}"
        + ("" if zoom == "all" else f" (step {zoom})")
        + ("" if warmup is None else _warmup_note(*warmup))
    )
    fig.tight_layout()
    return _save(fig, path)


def on_host(trace: Trace) -> bool:
    """A CPU-mode run: the executor without CUDA, whose "gpu" lane and pools are host memory."""
    return trace.meta.get("engine") == "executor" and trace.meta.get("device") == "cpu"


def _warmup_left_out(trace: Trace) -> tuple[int, float] | None:
    """(first step, its seconds) when a measured trace's first step took more than
    `WARMUP_FACTOR` times its steady step, else None (predicted traces have no warm-up)."""
    steps = trace.steps()
    if trace.meta.get("engine") != "executor" or len(steps) < 2:
        return None
    first = step_window(trace, steps[0])
    a, b = step_window(trace, _steady_step(trace))
    took = first[1] - first[0]
    return (steps[0], took) if took > WARMUP_FACTOR * (b - a) else None


def _warmup_note(step: int, seconds: float) -> str:
    return (
        f"\nstep {step} left out: {seconds:.1f} s of one-time warm-up (the host AdamW kernel's "
        "build on a first run, allocator and library start-up); zoom='all' draws it"
    )


def _tier_label(tier: str, host_run: bool) -> str:
    if tier == "gpu" and host_run:
        return "device buffers\n(host RAM, CPU mode)\nGiB"
    return f"{tier}\nGiB"


def tier_samples(trace: Trace) -> dict[str, list[tuple[float, int, int]]]:
    """Per panel tier, (time, bytes, pinned bytes) in time order. The host panel sums the
    trace's `pinned` and `cpu` tiers at every instant either changes."""
    out: dict[str, list[tuple[float, int, int]]] = {}
    for tier in ("gpu", "nvme"):
        rows = sorted((m.time, m.bytes) for m in trace.memory if m.tier == tier)
        if rows:
            out[tier] = [(t, b, 0) for t, b in rows]
    host = sorted((m.time, m.tier, m.bytes) for m in trace.memory if m.tier in ("pinned", "cpu"))
    now = {"pinned": 0, "cpu": 0}
    series: list[tuple[float, int, int]] = []
    for t, tier, b in host:
        now[tier] = b
        row = (t, now["pinned"] + now["cpu"], now["pinned"])
        if series and series[-1][0] == t:  # the other host tier changed at the same instant
            series[-1] = row
        else:
            series.append(row)
    if series:
        out["host"] = series
    return out


def _draw_lanes(
    ax: plt.Axes, trace: Trace, lo: float, hi: float, fig: plt.Figure, *, on_host: bool = False
) -> None:
    lanes = lane_order(trace.lanes())
    row = {lane: i for i, lane in enumerate(lanes)}
    visible = [s for s in trace.spans if s.end >= lo and s.start <= hi]
    by_kind: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in visible:
        by_kind.setdefault((s.lane, s.kind), []).append((s.start, s.duration))
    for (lane, kind), bars in by_kind.items():
        colour = KIND_COLOURS.get(kind, "#777777")
        ax.broken_barh(bars, (row[lane] - 0.4, 0.8), facecolors=colour, edgecolor="white", lw=0.3)
    _label_layers(ax, visible, row, hi - lo, fig)
    names = {"gpu": "compute\n(on the CPU)"} if on_host else {}
    ax.set_yticks(range(len(lanes)), [names.get(lane, lane) for lane in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.7)
    kinds = [k for k in KIND_COLOURS if any(s.kind == k for s in visible)]
    ax.legend(
        handles=[Patch(color=KIND_COLOURS[k], label=k) for k in kinds],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )


def _label_layers(
    ax: plt.Axes, spans: Sequence[Span], row: dict[str, int], span_s: float, fig: plt.Figure
) -> None:
    """Write `L12` on a bar when it is wide enough at this zoom (about 6 px per character)."""
    if span_s <= 0:
        return
    px_per_s = fig.get_figwidth() * fig.dpi * 0.8 / span_s
    for s in spans:
        label = f"L{s.unit}"
        if s.duration * px_per_s > 6.5 * len(label) + 4:
            ax.text(
                s.start + s.duration / 2,
                row[s.lane],
                label,
                ha="center",
                va="center",
                fontsize=6,
                color="white",
                clip_on=True,
            )


def _draw_memory(
    ax: plt.Axes, samples: list[tuple[float, int, int]], label: str, hi: float
) -> None:
    times = [t for t, _, _ in samples] + [max(hi, samples[-1][0])]
    values = [b / GIB for _, b, _ in samples]
    ax.stairs(values, times, fill=True, color="#4c72b0", alpha=0.5)
    pinned = [p / GIB for _, _, p in samples]
    if any(pinned):
        ax.stairs(pinned, times, fill=True, color="#2b4c7e", alpha=0.6, label="pinned")
        ax.legend(loc="upper left", fontsize=7, frameon=False)
    peak = max(values)
    ax.set_ylabel(label, fontsize=8)
    ax.set_ylim(0, peak * 1.15 if peak > 0 else 1)
    ax.text(
        0.995, 0.9, f"peak {peak:.3g} GiB", transform=ax.transAxes, ha="right", va="top", fontsize=8
    )


def plot_sweep(
    points: Sequence[dict[str, object]],
    path: str | Path,
    *,
    x: str = "batch",
    series: str | None = None,
    title: str = "",
) -> Path:
    """Tokens/s (solid) and the compute-only peak (dashed) against `x`, eta on a second axis.

    `points`: rows as `simulator.analyses` returns them (infeasible rows are skipped); `series`
    names a row key whose values get one line each (a model, a schedule).
    """
    rows = [p for p in points if p.get("feasible")]
    groups: dict[str, list[dict[str, object]]] = {}
    for p in rows:
        groups.setdefault(str(p.get(series, "")) if series else "", []).append(p)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    eta_ax = ax.twinx()
    xs_all = list(dict.fromkeys(p[x] for p in rows))
    numeric = _numeric(xs_all)
    where = {v: (v if numeric else i) for i, v in enumerate(xs_all)}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, group) in enumerate(groups.items()):
        c = colours[i % len(colours)]
        pos = [where[p[x]] for p in group]
        name = f"{label}: " if label else ""
        ax.plot(pos, [p["tokens_per_s"] for p in group], "o-", color=c, label=f"{name}tokens/s")
        ax.plot(
            pos,
            [p["compute_only_tokens_per_s"] for p in group],
            "--",
            color=c,
            alpha=0.6,
            label=f"{name}compute-only peak",
        )
        etas = [min(float(p["eta"]), 10.0) if p.get("eta") is not None else None for p in group]
        eta_ax.plot(
            [q for q, e in zip(pos, etas, strict=True) if e is not None],
            [e for e in etas if e is not None],
            "s:",
            color=c,
            alpha=0.7,
            ms=3,
        )
    eta_ax.axhline(1.0, color="#c44e52", lw=0.6)
    eta_ax.set_ylabel("eta = T_bwd / (T_d2h + T_update)  (dotted)")
    ax.set_xlabel(x)
    ax.set_ylabel("tokens / s")
    if numeric and len(xs_all) > 1 and min(xs_all) > 0 and max(xs_all) / min(xs_all) > 8:  # type: ignore[operator]
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(where.values()), [str(v) for v in xs_all], rotation=0 if numeric else 30)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    return _save(fig, path)


def _numeric(values: Sequence[object]) -> bool:
    return all(isinstance(v, int | float) for v in values)


def plot_gantt_pair(predicted: Trace, measured: Trace, path: str | Path) -> Path:
    """Predicted above measured, each over its first steady step, on one time axis measured from
    the step's start, so the two timelines line up lane by lane."""
    fig, axes = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(16, 2.5 + 0.7 * (len(predicted.lanes()) + len(measured.lanes()))),
    )
    for ax, trace, name in ((axes[0], predicted, "predicted"), (axes[1], measured, "measured")):
        lo, hi = step_window(trace, _steady_step(trace))
        shifted = _shift(trace, lo)
        _draw_lanes(ax, shifted, 0.0, hi - lo, fig)
        ax.set_title(
            f"{name}: step {_steady_step(trace)}, {hi - lo:.3f} s", loc="left", fontsize=10
        )
    axes[1].set_xlabel("time since the step's start (s)")
    info = measured.info
    fig.suptitle(f"{info.schedule}: {info.model}, batch {info.batch} x seq {info.seq}")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: plt.Figure, path: str | Path) -> Path:
    """Write the picture, creating its directory (as the commands' other outputs do)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _shift(trace: Trace, origin: float) -> Trace:
    spans = tuple(replace(s, start=s.start - origin, end=s.end - origin) for s in trace.spans)
    return replace(trace, spans=spans)
