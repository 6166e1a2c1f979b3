"""The prediction grid: `slide train` as a user runs it on many catalog shapes, each run's step
time against its own prediction (the summary's `step_time_error`).

    python -m bench.speed.shape_grid --group grid-a --out $OUT [--budget-s 540]
    python -m bench.speed.shape_grid --report bench/data/shape-grid/*.jsonl   (table + plot)

Groups: `cold` (llama-3.1-8b batch 16 with every default: the first run on a fresh lease
measures the host), `grid-a`, `grid-b` (--machine auto: the lease's own measured profile; `--no-replan`, so
every run predicts from that one profile and the re-fit does not move it between runs),
`preset` (--machine h200-16c-128g, uncalibrated), `top3` (the search's three fastest placements
of five points, each pinned and run), `traces` (five of the worst-predicted points again, each
with its measured trace saved), `recheck` (six grid points again, after a cost-model change). Every run's line (command, summary) goes to
`<out>/<group>.jsonl` as it ends; a run that would start past `--budget-s` is skipped and said.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TOKENS = Path("/tmp/slide-grid-tokens.npy")
# (model, batch, seq): six families, 0.5B-14B, batch 1-64, seq 512-8192
GRID_A = [
    ("qwen2.5-0.5b", 1, 512), ("qwen2.5-0.5b", 32, 2048), ("qwen3-0.6b", 8, 4096),
    ("llama-3.2-1b", 4, 1024), ("llama-3.2-1b", 64, 512), ("llama-3.2-1b", 16, 8192),
    ("qwen2.5-1.5b", 16, 1024), ("qwen2.5-1.5b", 1, 1024), ("qwen3-1.7b", 2, 8192),
    ("llama-3.2-3b", 16, 1024), ("llama-3.2-3b", 1, 2048),
]  # fmt: skip
GRID_B = [
    ("qwen2.5-3b", 8, 4096), ("qwen3-4b", 32, 1024), ("qwen3-4b", 4, 512),
    ("mistral-7b", 16, 1024), ("qwen2.5-7b", 2, 8192), ("qwen2.5-7b", 64, 512),
    ("llama-3.1-8b", 1, 4096), ("qwen3-8b", 8, 2048), ("qwen3-14b", 4, 4096),
]  # fmt: skip
PRESET = [
    ("qwen2.5-0.5b", 32, 2048), ("llama-3.2-1b", 4, 1024), ("llama-3.2-3b", 16, 1024),
    ("qwen3-4b", 4, 512), ("qwen2.5-7b", 2, 8192),
]  # fmt: skip
TRACED = [
    ("qwen2.5-0.5b", 1, 512), ("llama-3.2-1b", 4, 1024), ("qwen2.5-1.5b", 16, 1024),
    ("qwen3-1.7b", 2, 8192), ("qwen2.5-0.5b", 32, 2048),
]  # fmt: skip
RECHECK = [
    ("qwen2.5-0.5b", 32, 2048), ("qwen2.5-1.5b", 16, 1024), ("qwen3-1.7b", 2, 8192),
    ("qwen3-0.6b", 8, 4096), ("llama-3.2-3b", 16, 1024), ("mistral-7b", 16, 1024),
]  # fmt: skip
TOP3 = [
    ("llama-3.2-1b", 16, 1024), ("qwen2.5-1.5b", 8, 2048), ("llama-3.2-3b", 16, 1024),
    ("qwen3-4b", 4, 4096), ("qwen2.5-7b", 16, 1024),
]  # fmt: skip


def slide(*args: str) -> list[str]:
    return [sys.executable, "-m", "slide.cli", *args]


def train_command(model: str, batch: int, seq: int, machine: str, extra: list[str]) -> list[str]:
    steps = "4" if batch * seq >= 32768 else "6"
    steps = "8" if not extra else steps  # the defaults' re-plan check takes steps 2-3
    return slide("train", "--model", model, "--batch", str(batch), "--seq", str(seq),
                 "--steps", steps, "--data", str(TOKENS), "--machine", machine,
                 "--no-progress", *extra)  # fmt: skip


def pins(entry: dict) -> list[str]:
    """The flags that pin one placement of `slide plan --json`'s `top` list."""
    return ["--resident", str(len(entry["resident_units"])),
            "--streamed", str(len(entry["streamed_units"])),
            "--cache-units", str(entry["cache_units"]),
            "--keep-activations", str(entry["kept_tapes"]),
            "--activations", entry["activations"]]  # fmt: skip


def run(command: list[str], log: Path) -> dict:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    log.write_text(done.stderr[-20000:])
    try:
        summary = json.loads(done.stdout)
    except ValueError:
        summary = {"error": done.stderr.strip().splitlines()[-1:] or ["no output"]}
    return {"command": " ".join(command[2:]), "exit": done.returncode,
            "wall_s": round(time.perf_counter() - start, 1), "summary": summary}  # fmt: skip


def jobs(group: str) -> list[tuple[tuple, list[str]]]:
    if group == "cold":  # the README's path: every default, the re-plan check included
        return [(("llama-3.1-8b", 16, 1024), train_command("llama-3.1-8b", 16, 1024, "auto", []))]
    if group in ("grid-a", "grid-b"):
        points = GRID_A if group == "grid-a" else GRID_B
        return [(p, train_command(*p, "auto", ["--no-replan"])) for p in points]
    if group == "traces":  # the slow-predicted points, with their measured traces (slide format)
        return [(p, train_command(*p, "auto", ["--no-replan", "--trace-steps", "3:4",
                                               "--save-trace", f"/tmp/grid/trace-{i}.json"]))
                for i, p in enumerate(TRACED)]  # fmt: skip
    if group == "recheck":  # grid points again after a change to the cost model
        return [(p, train_command(*p, "auto", ["--no-replan"])) for p in RECHECK]
    if group == "preset":
        return [(p, train_command(*p, "h200-16c-128g", ["--no-replan"])) for p in PRESET]
    out = []
    for model, batch, seq in TOP3:
        planned = subprocess.run(
            slide("plan", "--model", model, "--batch", str(batch), "--seq", str(seq),
                  "--machine", "auto", "--json"), capture_output=True, text=True, check=True,
        )  # fmt: skip
        top = json.loads(planned.stdout)["placement"]["top"]
        for rank, entry in enumerate(top):
            cmd = train_command(model, batch, seq, "auto", ["--no-replan", *pins(entry)])
            out.append(((model, batch, seq, rank, entry["predicted_step_s"]), cmd))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--group", choices=("cold", "grid-a", "grid-b", "preset", "top3", "traces", "recheck")
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--report", nargs="*", type=Path)
    a = ap.parse_args()
    if a.report:
        from bench.speed.shape_grid_report import report

        report(a.report)
        return
    if not TOKENS.exists():
        import numpy as np

        ids = np.random.default_rng(0).integers(0, 32000, size=1_200_000, dtype=np.int64)
        np.save(TOKENS, ids)
    t0 = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / f"{a.group}.jsonl", "a") as sink:
        for n, (point, command) in enumerate(jobs(a.group)):
            if time.perf_counter() - t0 > a.budget_s:
                print(f"skipped {point}: past the {a.budget_s:.0f} s budget", flush=True)
                continue
            line = {"point": point, **run(command, a.out / f"{a.group}-{n}.log")}
            s = line["summary"]
            print(
                point,
                line["exit"],
                line["wall_s"],
                s.get("tokens_per_s"),
                s.get("predicted_tokens_per_s"),
                s.get("step_time_error"),
                flush=True,
            )
            sink.write(json.dumps(line) + "\n")
            sink.flush()


if __name__ == "__main__":
    main()
