"""Ctrl-C while the step loop runs, handed on only where the main thread holds nothing.

Python runs a SIGINT handler between two bytecodes of the main thread, so a handler that raises
(KeyboardInterrupt: Python's own, or `slide train`'s abort) can land just after a lock was taken
and before it is given back. The main thread's wait for an op takes the op's gate and gives it
back at once; an interrupt in between kept the gate taken, the op never read as done again, and
the run hung: `slide train` Ctrl-C'd in its first step, once in ~140 tries on 2 cores (a CI
run hit it). A lane marking the op done and at once sending SIGINT lost the gate 300 times in
300. While the loop runs, SIGINT is only counted; each wait hands the count to the handler it
replaced, before it blocks and at each poll (tests/executor/test_interrupts.py).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class AbortRun(KeyboardInterrupt):
    """A Ctrl-C that means: stop now. The loop lets it through, where a plain KeyboardInterrupt
    (the first one) lets the steps already started finish."""


class DeferredInterrupts:
    """A context: SIGINT is counted inside it, and `deliver` runs the replaced handler once per
    count (where it raises, the caller's frame holds no lock). Outside the main thread, where
    Python delivers no signal, it does nothing."""

    def __init__(self) -> None:
        self.pending = 0
        self._replaced: Any = None

    def __enter__(self) -> DeferredInterrupts:
        if threading.current_thread() is threading.main_thread():
            self._replaced = signal.signal(signal.SIGINT, self._count)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._replaced is None:
            return
        signal.signal(signal.SIGINT, self._replaced)
        if exc_type is None:
            self.deliver()  # a Ctrl-C of the loop's last moments is not lost

    def _count(self, signum: int, frame: FrameType | None) -> None:
        self.pending += 1

    def deliver(self) -> None:
        """Run the replaced handler for each SIGINT counted (it may raise KeyboardInterrupt)."""
        while self.pending:
            self.pending -= 1
            if callable(self._replaced):
                self._replaced(signal.SIGINT, None)
            elif self._replaced == signal.SIG_DFL:  # what SIG_DFL does in Python: stop
                raise KeyboardInterrupt


class CtrlCSafeThread(threading.Thread):
    """A thread whose `join` a Ctrl-C can interrupt without losing it. CPython 3.11's
    `Thread.join`, interrupted by a handler that raises, releases the thread's own state lock
    and marks it stopped while it still runs: a later join returned at once and the process
    exited with the thread in C code (SIGABRT in a CI run; `slide train` double Ctrl-C'd left
    its checkpoint writer running at exit 15 times in 110 on 2 cores). This one is joined on an
    event its `run` sets when it ends, which an interrupt only interrupts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.ended.set()

    def join(self, timeout: float | None = None) -> None:
        if self.ended.wait(timeout):
            super().join()  # the thread's last bytecodes after `run`
