"""A long run's metrics file (`slide train --metrics`) as figures: step time per step, host RSS
and GPU memory allocated/reserved every --log-every steps, each with its least-squares slope
and 95% interval (flat = an interval holding zero), as a PNG and a JSON summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def slope(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Least-squares slope of y over x with its 95% interval (normal approximation). Both are
    centred first: a series that never moves (GPU reserved: 84 GB at every sample) then fits
    exactly zero instead of rounding noise of its size."""
    xc, yc = x - x.mean(), y - y.mean()
    sxx = float(np.sum(xc**2))
    per_step = float(np.sum(xc * yc)) / sxx
    dof = max(len(x) - 2, 1)
    sigma2 = float(np.sum((yc - per_step * xc) ** 2)) / dof
    return {
        "per_step": per_step,
        "ci95": 1.96 * float(np.sqrt(sigma2 / sxx)),
        "mean": float(y.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("metrics", help="metrics JSONL of slide train")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps left out [10]")
    args = parser.parse_args()
    rows = [json.loads(line) for line in Path(args.metrics).read_text().splitlines()]
    steady = [r for r in rows if r["step"] > args.skip]
    x = np.array([r["step"] for r in steady], dtype=float)
    series = {"step_time_s": np.array([r["step_time_s"] for r in steady])}
    sampled = [r for r in steady if "host_rss_bytes" in r]
    xs = np.array([r["step"] for r in sampled], dtype=float)
    for key in (
        "host_rss_bytes",
        "host_pinned_pool_bytes",
        "gpu_allocated_bytes",
        "gpu_reserved_bytes",
    ):
        if sampled and key in sampled[0]:
            series[key] = np.array([r[key] for r in sampled], dtype=float)
    summary = {k: slope(x if k == "step_time_s" else xs, v) for k, v in series.items()}
    print(json.dumps({"steps": len(rows), "after_warmup": len(steady), **summary}, indent=2))

    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(series), 1, figsize=(7, 2.2 * len(series)), sharex=True, squeeze=False
    )
    for ax, (key, y) in zip(axes[:, 0], series.items(), strict=True):
        xx = x if key == "step_time_s" else xs
        scale, unit = (1.0, "s") if key == "step_time_s" else (2**30, "GiB")
        ax.plot(xx, y / scale, ".", ms=3)
        s = summary[key]
        ax.set_ylabel(f"{key.removesuffix('_bytes').removesuffix('_s')} ({unit})")
        ax.set_title(f"slope {s['per_step'] / scale:+.2e} {unit}/step (±{s['ci95'] / scale:.1e})",
                     fontsize=8)  # fmt: skip
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
