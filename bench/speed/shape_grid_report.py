"""The prediction grid's table (markdown) and its predicted-vs-measured plot, from the jsonl
lines `bench.speed.shape_grid` wrote; `top3` lines become the search's check."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def _lines(paths: list[Path]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for path in paths:
        for line in path.read_text().splitlines():
            groups[path.stem].append(json.loads(line))
    return groups


def _row(group: str, line: dict) -> str:
    model, batch, seq = line["point"][:3]
    s = line["summary"]
    error = s.get("step_time_error")
    shown = f"{error:+.1%}" if error is not None else "n/a"
    return (f"| {group} | {model} | {batch} | {seq} | {s.get('predicted_tokens_per_s', 0):,.0f} "
            f"| {s.get('tokens_per_s', 0):,.0f} | {shown} |")  # fmt: skip


def _top3(lines: list[dict]) -> list[str]:
    by_point: dict[tuple, list[tuple[int, float, float]]] = defaultdict(list)
    for line in lines:
        model, batch, seq, rank, predicted = line["point"]
        by_point[(model, batch, seq)].append((rank, predicted, line["summary"]["tokens_per_s"]))
    out = ["| point | predicted step s (1st, 2nd, 3rd) | measured tokens/s (1st, 2nd, 3rd) "
           "| 1st vs measured best |", "|---|---|---|---|"]  # fmt: skip
    for (model, batch, seq), runs in by_point.items():
        runs.sort()
        best = max(r[2] for r in runs)
        gap = runs[0][2] / best - 1
        out.append(f"| {model} b{batch} s{seq} | {', '.join(f'{r[1]:.4f}' for r in runs)} | "
                   f"{', '.join(f'{r[2]:,.0f}' for r in runs)} | {gap:+.1%} |")  # fmt: skip
    return out


def report(paths: list[Path], plot: Path | None = None) -> None:
    groups = _lines(paths)
    print("| group | model | batch | seq | predicted tok/s | measured tok/s | step-time error |")
    print("|---|---|---|---|---|---|---|")
    points = []
    for group in ("cold", "grid-a", "grid-b", "preset"):
        for line in groups.get(group, []):
            print(_row(group, line))
            s = line["summary"]
            points.append((group, s.get("predicted_tokens_per_s"), s.get("tokens_per_s")))
    if "top3" in groups:
        print("\n" + "\n".join(_top3(groups["top3"])))
    _plot(points, plot or paths[0].parent / "predicted_vs_measured.png")


def _plot(points: list[tuple[str, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    style = {"cold": ("k", "*"), "grid-a": ("C0", "o"), "grid-b": ("C0", "o"),
             "preset": ("C3", "s")}  # fmt: skip
    seen = set()
    for group, predicted, measured in points:
        if predicted and measured:
            color, marker = style[group]
            label = {"preset": "h200-16c-128g preset", "cold": "cold start, defaults"}.get(
                group, "--machine auto (calibrated)"
            )
            ax.scatter(predicted, measured, c=color, marker=marker,
                       label=None if label in seen else label)  # fmt: skip
            seen.add(label)
    lo, hi = 2e3, 2e5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.95, 1.05):  # step time within 5%: tokens/s within 1/1.05 .. 1/0.95
        ax.plot([lo, hi], [lo / f, hi / f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="predicted tokens/s", ylabel="measured tokens/s (steady steps)",
           title="slide train on the H200: prediction vs measurement")  # fmt: skip
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")
