"""Ctrl-C while `slide train` runs: the first finishes the step in flight, publishes a
checkpoint and ends the run with code 130; a second (or one before the first step has finished)
aborts at once, leaving the last published checkpoint as it was.

The handler is installed only on the main thread (the signal module allows no other) and the
previous one restored on exit.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from executor.interrupts import AbortRun
from slide.train_report import Reporter

log = logging.getLogger(__name__)


class CtrlC:
    """SIGINT while training: the first asks the run to stop after the step in flight (and
    save); a second, or one before the first step has finished, aborts (`AbortRun`, which the
    step loop lets through), and later ones are ignored while the abort unwinds."""

    def __init__(self) -> None:
        self.requested = False
        self._armed = self._aborting = False
        self._previous: Any = None

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def after_step(self, reporter: Reporter, *step: Any) -> bool:
        """on_step: report the step; from now on a Ctrl-C stops after the step in flight."""
        reporter.on_step(*step)
        self._armed = True
        return self.requested

    def finishing(self) -> None:
        """The steps are over: from here a Ctrl-C aborts the final save."""
        self._armed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._aborting:  # the abort is unwinding (lanes joined, files closed): let it
            return
        if self.requested or not self._armed:
            self._aborting = True
            raise AbortRun
        self.requested = True
        log.warning(
            "interrupted: finishing the step in flight, then saving (Ctrl-C again to abort)"
        )
