"""Measured figures as rows: `bench/results.csv` (date, commit, device, command, figure, value),
one row per figure of one run, and the README's Measured table made from them.

A figure enters the CSV from the run that measured it (`--add-jsonl`: the `{"command",
"summary"}` lines the device scripts write), so the README cannot show a number no run made:
its table is `readme_table()` of the CSV, between the README's `results:start` and
`results:end` marks (`python -m bench.results --write-readme`; a test fails when they differ).
RESULTS.md keeps the analysis: conditions, spreads, misses.

    python -m bench.results --add-jsonl RUNS.jsonl --date 2026-12-02 --commit 447c90f \\
        --device "H200 132 SMs, 16 cores, 125 GiB"
    python -m bench.results --write-readme
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from dataclasses import astuple, dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "bench" / "results.csv"
README = ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
SUMMARY_FIGURES = ("tokens_per_s", "predicted_tokens_per_s", "step_time_error")


@dataclass(frozen=True, slots=True)
class Row:
    date: str
    commit: str
    device: str
    command: str
    figure: str
    value: float


@dataclass(frozen=True, slots=True)
class TableRow:
    """A README row: the median of `figure` over the newest (date, commit)'s runs whose
    command matches `command` (a regular expression searched in it)."""

    label: str
    command: str
    figure: str = "tokens_per_s"


README_ROWS = (
    TableRow("llama-3.2-3b, batch 16, the defaults before global clipping (no clipping)",
             r"--no-progress --model llama-3\.2-3b --batch 16 --seq 1024$"),
    TableRow("llama-3.2-3b, batch 16, the defaults (`--clip global`)",
             r"(--model llama-3\.2-3b --batch 16 --seq 1024 --steps 10 --no-progress --clip global"
             r"|--no-progress --model llama-3\.2-3b)$"),
    TableRow("llama-3.2-3b, batch 16, `--clip none`",
             r"--model llama-3\.2-3b --batch 16 --seq 1024 --steps 10 --no-progress --clip none$"),
    TableRow("llama-3.2-3b, batch 16, pure sliding (`--placement small`)",
             r"--no-progress --model llama-3\.2-3b --batch 16 --seq 1024 --placement small$"),
    TableRow("llama-3.2-3b, batch 16, a 24 GB budget (`--gpu-memory-gb 24`), `--clip none`",
             r"--model llama-3\.2-3b --gpu-memory-gb 24 --no-replan --clip none$"),
    TableRow("llama-3.2-3b, batch 16, a 24 GB budget, global clipping, speculation kept",
             r"--model llama-3\.2-3b --gpu-memory-gb 24 --no-replan --clip-norm 1e6$"),
    TableRow("llama-3.2-3b, batch 16, a 24 GB budget, global clipping, every update waiting",
             r"--model llama-3\.2-3b --gpu-memory-gb 24 --no-replan --speculate 0$"),
    TableRow("llama-3.1-8b, batch 16, the defaults before global clipping (no clipping)",
             r"--no-progress --model llama-3\.1-8b --batch 16 --seq 1024$"),
    TableRow("llama-3.1-8b, batch 16, the defaults (`--clip global`)",
             r"(--model llama-3\.1-8b --batch 16 --seq 1024 --steps 10 --no-progress --clip global"
             r"|--no-progress --model llama-3\.1-8b)$"),
    TableRow("llama-3.1-8b, batch 16, `--clip none`",
             r"--model llama-3\.1-8b --batch 16 --seq 1024 --steps 10 --no-progress --clip none$"),
    TableRow("qwen2.5-0.5b, batch 32, seq 2048", r"--model qwen2\.5-0\.5b --batch 32 --seq 2048 .*auto"),
    TableRow("qwen2.5-7b, batch 2, seq 8192", r"--model qwen2\.5-7b --batch 2 --seq 8192 .*auto"),
    TableRow("qwen3-14b, batch 4, seq 4096", r"--model qwen3-14b --batch 4 --seq 4096 .*auto"),
    TableRow("llama-3.1-8b, a cold `--machine auto` start: seconds to the first step",
             r"--model llama-3\.1-8b --batch 16 --seq 1024 --steps 8 .*--machine auto --no-progress$",
             "to_first_step_s"),
)  # fmt: skip


def load(path: Path = CSV) -> list[Row]:
    with path.open(newline="") as f:
        return [Row(**{**r, "value": float(r["value"])}) for r in csv.DictReader(f)]


def save(rows: list[Row], path: Path = CSV) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow([f.name for f in fields(Row)])
        out.writerows(astuple(r) for r in rows)


def rows_of_runs(lines: list[str], *, date: str, commit: str, device: str) -> list[Row]:
    """The summary figures of each run (`{"command": ..., "summary": {...}}` per line)."""
    out = []
    for line in lines:
        run = json.loads(line)
        summary = run.get("summary") or {}
        figures = {k: summary.get(k) for k in SUMMARY_FIGURES}
        figures["to_first_step_s"] = (summary.get("startup") or {}).get("to_first_step_s")
        out += [Row(date, commit, device, run["command"], k, float(v))
                for k, v in figures.items() if isinstance(v, int | float)]  # fmt: skip
    return out


def readme_table(rows: list[Row]) -> str:
    lines = ["| | value | step time vs predicted | runs | date, commit | command |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for want in README_ROWS:
        pattern = re.compile(want.command)
        hits = [r for r in rows if pattern.search(r.command)]
        measured = [r for r in hits if r.figure == want.figure]
        if not measured:
            raise ValueError(f"no row of {CSV.name} measures {want.label!r} ({want.command})")
        last = measured[-1]  # rows are appended as runs come in: the last is the newest
        runs = [r for r in hits if (r.date, r.commit) == (last.date, last.commit)]
        value = statistics.median(r.value for r in runs if r.figure == want.figure)
        errors = [r.value for r in runs if r.figure == "step_time_error"]
        error = f"{statistics.median(errors):+.1%}" if errors else ""
        count = sum(r.figure == want.figure for r in runs)
        command = runs[0].command.removeprefix("slide.cli ")
        shown = f"{value:,.0f}" if value >= 100 else f"{value:.1f} s"
        lines.append(
            f"| {want.label} | {shown} | {error} | {count} | {last.date}, {last.commit} "
            f"| `slide {command}` |"
        )
    return "\n".join(lines) + "\n"


def with_table(readme: str, table: str) -> str:
    """`readme` with its results block replaced by `table`."""
    head, start, rest = readme.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README.md needs a {START} ... {END} block")
    return f"{head}{START}\n{table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.results", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--add-jsonl", type=Path, help="append the figures of these runs")
    ap.add_argument("--date")
    ap.add_argument("--commit")
    ap.add_argument("--device")
    ap.add_argument("--write-readme", action="store_true", help="rewrite README's table")
    args = ap.parse_args(argv)
    if args.add_jsonl:
        if not (args.date and args.commit and args.device):
            ap.error("--add-jsonl needs --date, --commit and --device")
        lines = [x for x in args.add_jsonl.read_text().splitlines() if x.strip()]
        added = rows_of_runs(lines, date=args.date, commit=args.commit, device=args.device)
        save(load() + added)
        print(f"added {len(added)} rows to {CSV}")
    if args.write_readme:
        README.write_text(with_table(README.read_text(), readme_table(load())))
        print(f"wrote the Measured table of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
