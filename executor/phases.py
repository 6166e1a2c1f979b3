"""Where a run's wall time goes before its first step and after its last: named phases.

`slide train` times each phase of start-up (imports, model spec, plan, data, weights, buffers,
state, the first step) and of shutdown (state hand-back, saving, freeing) with one `Phases`,
logs a line per phase as it ends (`-v`) and puts the table in the run's summary. Phases run one
after another on the main thread; a phase entered twice adds up. Background work that overlaps
them (the host AdamW build) is recorded with `add`, marked as overlapped, and not summed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("slide.phases")


def since_process_start() -> float:
    """Seconds since this process started (from /proc, to 10 ms; 0 where /proc is absent)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


# a command entered this soon after its process started runs in a process of its own
OWN_PROCESS_S = 10.0
_age_before_command = [0.0]  # seconds of the process's life before the latest command: not its


def mark_command_start() -> None:
    """`slide.cli.main` was entered: a command begins (see `since_command_start`)."""
    age = since_process_start()
    _age_before_command[0] = age if age >= OWN_PROCESS_S else 0.0


def since_command_start() -> float:
    """Seconds since the command began. A process started for it (the `slide` script, a
    rank) counts from its own start, the interpreter and the imports before `main` included;
    one that lives on around it (a notebook or a test calling `main`) from that call: its
    start-up read the whole process's age (1,604 s in a test run)."""
    return since_process_start() - _age_before_command[0]


class Phases:
    """Seconds per phase, in the order phases first ended."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.overlapped: dict[str, float] = {}
        self.marks: dict[str, float] = {}  # name -> time.perf_counter() when marked

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float, *, overlapped: bool = False) -> None:
        table = self.overlapped if overlapped else self.seconds
        table[name] = table.get(name, 0.0) + seconds
        log.info("%s %.2f s%s", name, seconds, " (in the background)" if overlapped else "")

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.perf_counter())

    def since(self, name: str) -> float:
        return time.perf_counter() - self.marks[name]

    def table(self, names: tuple[str, ...]) -> dict[str, float]:
        """Rounded seconds of the phases among `names` that ran, in that order."""
        return {f"{k}_s": round(self.seconds[k], 3) for k in names if k in self.seconds}
