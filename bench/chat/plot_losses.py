"""Train and eval loss of a `slide train --metrics` run, one PNG: the train loss per step and
the eval loss at each eval (the lines `slide train` writes with an `eval_loss`).

    python -m bench.chat.plot_losses METRICS.jsonl OUT.png [TITLE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def losses(metrics: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    train, evals = [], []
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "eval_loss" in row:
            evals.append((row["step"], row["eval_loss"]))
        elif "loss" in row and "step" in row:
            train.append((row["step"], row["loss"]))
    return train, evals


def main(metrics: str, out: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = losses(Path(metrics))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*train, strict=True), lw=1, label="train loss (each step)")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="eval loss (held-out conversations)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (assistant tokens)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"{len(train)} steps, {len(evals)} evals: train {train[0][1]:.3f} -> {train[-1][1]:.3f}"
          + (f", eval {evals[0][1]:.3f} -> {evals[-1][1]:.3f}" if evals else ""))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:4])
