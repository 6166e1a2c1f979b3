"""bench/results.csv and the README's Measured table made from it."""

from __future__ import annotations

import json

import pytest

from bench import results


def test_the_readme_table_is_the_csvs() -> None:
    readme = results.README.read_text()
    assert results.with_table(readme, results.readme_table(results.load())) == readme, (
        "README.md's Measured table differs from bench/results.csv: "
        "run `python -m bench.results --write-readme`"
    )


def _run(command: str, tokens_per_s: float, error: float) -> str:
    return json.dumps({"command": command, "summary": {"tokens_per_s": tokens_per_s,
                                                       "step_time_error": error}})  # fmt: skip


def test_a_row_shows_the_median_of_the_newest_commits_runs(monkeypatch) -> None:
    monkeypatch.setattr(results, "README_ROWS", (results.TableRow("3B", r"--model m3b$"),))
    old = results.rows_of_runs([_run("train --model m3b", 100.0, 0.5)], date="2026-12-01",
                               commit="aaa", device="d")  # fmt: skip
    runs = [
        _run("train --model m3b", v, e) for v, e in ((900.0, 0.1), (1200.0, 0.3), (1000.0, 0.2))
    ]
    new = results.rows_of_runs(runs, date="2026-12-01", commit="bbb", device="d")
    other = results.rows_of_runs([_run("train --model m3b --batch 2", 5.0, 0.0)], date="2026-12-02",
                                 commit="ccc", device="d")  # fmt: skip
    row = results.readme_table(old + new + other).splitlines()[2]
    assert row == "| 3B | 1,000 | +20.0% | 3 | 2026-12-01, bbb | `slide train --model m3b` |"


def test_a_row_no_run_measured_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(results, "README_ROWS", (results.TableRow("14B", r"--model m14b"),))
    with pytest.raises(ValueError, match=r"no row of results\.csv measures '14B'"):
        results.readme_table([])


def test_the_csv_reads_back(tmp_path) -> None:
    rows = results.rows_of_runs([_run("train --model x", 12.5, -0.01)], date="2026-12-02",
                                commit="abc", device="H200, 16 cores")  # fmt: skip
    path = tmp_path / "r.csv"
    results.save(rows, path)
    assert results.load(path) == rows
