"""NVMe drive files spread over directories (`--nvme-dir` once per drive): drive k's file lives
in dirs[k % len(dirs)], and where the files live changes nothing in the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import assert_bitwise_equal, run_executor

from executor.nvme import drive_paths


def test_drive_k_goes_to_directory_k_mod_n(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert drive_paths([a, b], 3) == [a / "nvme0.bin", b / "nvme1.bin", a / "nvme2.bin"]
    assert drive_paths(str(a), 2) == [a / "nvme0.bin", a / "nvme1.bin"]  # one path: all there
    assert drive_paths((str(a), str(b)), 1) == [a / "nvme0.bin"]
    with pytest.raises(ValueError, match="at least one directory"):
        drive_paths([], 2)


def test_a_run_over_two_directories_equals_one_in_a_temporary_directory(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    config = {"optimizer": "nvme", "drives": 3, "steps": 2}
    spread = run_executor(False, train_kwargs={"nvme_dir": [a, str(b)]}, **config)
    assert sorted(p.name for p in a.iterdir()) == ["nvme0.bin", "nvme2.bin"]
    assert sorted(p.name for p in b.iterdir()) == ["nvme1.bin"]
    assert all(p.stat().st_size > 0 for p in (*a.iterdir(), *b.iterdir()))
    assert_bitwise_equal(spread, run_executor(False, **config))
