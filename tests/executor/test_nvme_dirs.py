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
    # every unit sliding, so the state really lives in the files
    config = {"optimizer": "nvme", "drives": 3, "steps": 2, "resident": 0, "streamed": 0}
    seen = []  # the files of each directory, with their sizes, after each step

    def look(*_: object) -> None:
        seen.append(
            {d.name: sorted((p.name, p.stat().st_size) for p in d.iterdir()) for d in (a, b)}
        )

    spread = run_executor(False, train_kwargs={"nvme_dir": [a, str(b)], "on_step": look}, **config)
    assert len(seen) == 2
    for files in seen:
        assert [name for name, _ in files["a"]] == ["nvme0.bin", "nvme2.bin"]
        assert [name for name, _ in files["b"]] == ["nvme1.bin"]
        assert all(size > 0 for name, size in files["a"] + files["b"])
    assert not list(a.iterdir()) and not list(b.iterdir())  # removed when the run ends
    assert_bitwise_equal(spread, run_executor(False, **config))
