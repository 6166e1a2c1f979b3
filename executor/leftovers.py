"""Owner markers on what a run leaves on disk while it runs, so that the leftovers of a run
killed by SIGKILL (which no clean-up survives: a drive file can be the size of the whole
optimizer state) are removed by the next run, and nothing else is.

- A drive file `nvme0.bin` has a marker `nvme0.bin.owner` beside it, written before the file
  and removed after it, holding its writer's pid and that process's start time (pids are
  reused). `claim` removes a file whose marker names a process that is gone; a file without a
  marker is not Slide's, and stays.
- The scratch directory of a run without `--nvme-dir` carries its owner in its name
  (`slide-nvme-<pid>-<start>-<random>`); `scratch_dir` removes the scratch directories of
  processes that are gone, once their drive files are removed as above, and only if nothing
  else is in them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

SCRATCH_PREFIX = "slide-nvme-"
SCRATCH_NAME = re.compile(rf"{SCRATCH_PREFIX}(\d+)-(\d*)-")
MARKER_SUFFIX = ".owner"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat: the
    fields after the command's closing parenthesis start at field 3), or "" where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


def _owner() -> str:
    return f"{os.getpid()}-{_start_time(os.getpid())}"


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        pass
    return not start or _start_time(pid) in (start, "")  # another start time: a reused pid


def marker(path: Path) -> Path:
    return path.with_name(path.name + MARKER_SUFFIX)


def _dead_owner(mark: Path) -> bool:
    """Whether the marker names a process that is gone (an unreadable one: its writer was
    killed while writing it)."""
    try:
        pid, _, start = mark.read_text().strip().partition("-")
    except FileNotFoundError:
        return False
    return not pid.isdigit() or not _alive(int(pid), start)


def claim(path: Path) -> None:
    """Mark `path`, about to be created, as this process's. A dead run's file and marker there
    are removed first; a live run's marker refuses (FileExistsError naming its pid)."""
    mark = marker(path)
    if _dead_owner(mark):
        release(path)
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise FileExistsError(
            f"{path} is in use by process {mark.read_text().strip().partition('-')[0]} "
            "(another slide train?): give that run another --nvme-dir"
        ) from None
    with os.fdopen(fd, "w") as f:
        f.write(_owner())


def release(path: Path) -> None:
    """Remove `path` and its marker (the file first: a marker without its file is harmless)."""
    path.unlink(missing_ok=True)
    marker(path).unlink(missing_ok=True)


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A new directory for a run's drive files, removed at the end; the scratch directories
    of dead runs are removed first."""
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{SCRATCH_PREFIX}*"):
        found = SCRATCH_NAME.match(old.name)
        if found and old.is_dir() and not _alive(int(found[1]), found[2]):
            _remove_dead(old)
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{_owner()}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _remove_dead(directory: Path) -> None:
    """A dead run's scratch directory: its marked files, then the directory if nothing else
    is left in it."""
    for mark in directory.glob(f"*{MARKER_SUFFIX}"):
        if _dead_owner(mark):
            release(mark.with_name(mark.name.removesuffix(MARKER_SUFFIX)))
    with contextlib.suppress(OSError):
        directory.rmdir()
