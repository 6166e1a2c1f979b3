"""NVMe drive files spread over directories (`--nvme-dir` once per drive): drive k's file lives
in dirs[k % len(dirs)], and where the files live changes nothing in the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import assert_bitwise_equal, graph_of, run_executor

from executor.nvme_io import align_up
from slide_ir.ir.drives import drive_contents, drive_paths, saved_per_drive
from slide_ir.ir.graph import PoolRole


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
        # each beside its owner marker (`executor.leftovers`)
        assert [name for name, _ in files["a"]] == ["nvme0.bin", "nvme0.bin.owner", "nvme2.bin",
                                                    "nvme2.bin.owner"]  # fmt: skip
        assert [name for name, _ in files["b"]] == ["nvme1.bin", "nvme1.bin.owner"]
        assert all(size > 0 for name, size in files["a"] + files["b"])
    assert not list(a.iterdir()) and not list(b.iterdir())  # removed when the run ends
    assert_bitwise_equal(spread, run_executor(False, **config))


def test_each_file_holds_only_its_own_drives_saved_inputs(tmp_path: Path) -> None:
    """Saved layer inputs go to drive (layer mod drives); each drive's file reserves slots for
    those layers only, as the plan says (before: one pool for all drives, so every drive's file
    reserved every slot: 2x the ledger's bytes on 2 drives)."""
    config = {"activations": "nvme", "keep_activations": 0, "steps": 1}
    graph = graph_of(False, drives=2, **config)
    held = drive_contents(graph, 2)
    saved = [p for p in graph.pools if p.role == PoolRole.NVME_HIDDEN]
    assert sum(d.act_bytes for d in held) == sum(p.bytes for p in saved) > 0
    assert [p.slots for p in saved] == saved_per_drive(sum(p.slots for p in saved), 2)
    sizes = []

    def look(*_: object) -> None:
        sizes.append([p.stat().st_size for p in drive_paths(tmp_path, 2)])

    run_executor(False, drives=2, train_kwargs={"nvme_dir": tmp_path, "on_step": look}, **config)
    # CPU mode runs in FP32: a slot is twice the plan's BF16 bytes, each padded to ALIGN
    slot = align_up(2 * saved[0].slot_bytes)
    assert sizes == [[p.slots * slot for p in saved]]
