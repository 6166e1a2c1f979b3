"""Owner markers: a dead run's drive file is removed by the next claim, a live run's refuses,
and a file without a marker (not Slide's) is never touched."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from executor import leftovers


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_runs_file_is_removed(tmp_path):
    path = tmp_path / "nvme0.bin"
    path.write_bytes(b"state")
    leftovers.marker(path).write_text(f"{dead_pid()}-1")
    leftovers.claim(path)
    assert not path.exists() and leftovers.marker(path).read_text().startswith(f"{os.getpid()}-")
    leftovers.release(path)
    assert list(tmp_path.iterdir()) == []


def test_a_live_runs_file_is_refused(tmp_path):
    path = tmp_path / "nvme0.bin"
    path.write_bytes(b"state")
    leftovers.claim(path)  # this process: alive
    with pytest.raises(FileExistsError, match=f"in use by process {os.getpid()}"):
        leftovers.claim(path)
    assert path.read_bytes() == b"state"


def test_a_reused_pid_is_a_dead_owner(tmp_path):
    path = tmp_path / "nvme0.bin"
    leftovers.marker(path).write_text(f"{os.getpid()}-1")  # this pid, another start time
    leftovers.claim(path)
    assert leftovers.marker(path).read_text() != f"{os.getpid()}-1"


def test_a_dead_runs_scratch_dir_goes_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(leftovers.tempfile, "gettempdir", lambda: str(tmp_path))
    dead = tmp_path / f"{leftovers.SCRATCH_PREFIX}{dead_pid()}-1-abc"
    dead.mkdir()
    (dead / "nvme0.bin").write_bytes(b"state")
    leftovers.marker(dead / "nvme0.bin").write_text(dead.name.split("-")[2] + "-1")
    kept = tmp_path / f"{leftovers.SCRATCH_PREFIX}{dead_pid()}-1-def"
    kept.mkdir()
    (kept / "notes.txt").write_text("not Slide's")
    other = tmp_path / f"{leftovers.SCRATCH_PREFIX}abcdefgh"  # no owner in its name
    other.mkdir()
    with leftovers.scratch_dir() as mine:
        assert Path(mine).is_dir()
        assert not dead.exists() and (kept / "notes.txt").exists() and other.is_dir()
    assert not Path(mine).exists()
