"""Slide's prediction for the SlideFormer paper's batch-size table, run as a user would run it.

Why: the issue asks for Slide's predicted throughput on the `paper-pc-4090` preset (the SlideFormer
paper's RTX 4090 PC) beside SlideFormer's published figures for Llama-3.1-8B at batch 8-64, seq
1024. This calls `slide simulate` once per (model, batch, placement) exactly as a user would, keeps
every command's stdout verbatim in simulate_raw.txt and prints one row per run (the markdown table
in slideformer_8b_table.md is written from those rows).

    python -m bench.speed.paper_table [--out bench/data/paper-4090]

Published figures are not read from a plot: `PUBLISHED` stays empty until the paper's numbers are
at hand, and the rows then print the ratio beside them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

MACHINE = "paper-pc-4090"
SEQ = 1024  # the paper's and its published bench.sh's sequence length
BATCHES = (8, 16, 32, 64)
MODELS = ("llama-3.1-8b", "llama-3.2-3b")
# (placement, clip): None is the default (`fast`, `global`). SlideFormer's published code clips
# no gradients, so `--clip none` is the like-for-like column; the default is the user's own.
MODES = ((None, "none"), ("small", "none"), (None, None))
DATE = "2026-12-06"

# (model, batch) -> (tokens/s, source). Empty: the paper's figures were not readable here.
PUBLISHED: dict[tuple[str, int], tuple[float, str]] = {}


def slide_bin() -> str:
    here = Path(sys.executable).with_name("slide")
    return str(here) if here.exists() else (shutil.which("slide") or "slide")


def command(model: str, batch: int, placement: str | None, clip: str | None) -> list[str]:
    cmd = ["slide", "simulate", "--model", model, "--machine", MACHINE]
    cmd += ["--batch", str(batch), "--seq", str(SEQ)]
    cmd += ["--placement", placement] if placement else []
    return cmd + (["--clip", clip] if clip else [])


def run(cmd: list[str], *, as_json: bool) -> tuple[int, str]:
    argv = [slide_bin(), *cmd[1:], *(["--json"] if as_json else [])]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout


def describe(placement: dict) -> str:
    c = placement.get("chosen") or {}
    res, streamed = len(c.get("resident_units", [])), len(c.get("streamed_units", []))
    return (
        f"{res} resident, {streamed} streamed, inputs {c.get('activations')}, "
        f"{c.get('cache_units')} cache, {c.get('kept_tapes')} tapes"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench/data/paper-4090"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    raw: list[str] = []
    rows: list[dict] = []
    for model in MODELS:
        for batch in BATCHES:
            for placement, clip in MODES:
                cmd = command(model, batch, placement, clip)
                rc, text = run(cmd, as_json=False)
                raw.append(f"$ {' '.join(cmd)}\n(exit {rc})\n{text}")
                rc_j, out = run(cmd, as_json=True)
                d = json.loads(out) if rc_j == 0 and out.strip() else {}
                rows.append({"model": model, "batch": batch,
                             "mode": f"{placement or 'fast'}/{clip or 'global'}",
                             "cmd": " ".join(cmd), "rc": rc, **d})  # fmt: skip
    (args.out / "simulate_raw.txt").write_text("\n".join(raw))
    for r in rows:
        head = f"{r['model']:13} b{r['batch']:<3} {r['mode']:12}"
        if not r.get("feasible"):
            print(f"{head} does not fit (rc {r['rc']})")
            continue
        pub = PUBLISHED.get((r["model"], r["batch"]))
        ratio = f"{r['tokens_per_s'] / pub[0]:.2f}x of {pub[0]:,.0f}" if pub else "published -"
        searched = (r["placement"].get("chosen") or {}).get("predicted_step_s")
        search = f"{searched:6.3f} s" if searched is not None else "     -  "
        print(f"{head} {r['tokens_per_s']:8,.0f} tok/s  step {r['step_time_s']:6.3f} s  "
              f"search {search}  eta {r['eta']:.2f}  "
              f"{r['bottleneck']:4}  {describe(r['placement'])}  {ratio}")  # fmt: skip


if __name__ == "__main__":
    main()
