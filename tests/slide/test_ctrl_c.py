"""`slide train`'s Ctrl-C rules, signal by signal: before the first step has finished there is
nothing to finish, so it aborts; after it, the first stops the run after the step in flight, a
second aborts, and later ones are ignored while the abort unwinds."""

import signal

import pytest

from executor.interrupts import AbortRun
from slide.training import _CtrlC


class _Reporter:
    def on_step(self, *step: object) -> None:
        pass


def test_before_the_first_step_ctrl_c_aborts() -> None:
    with _CtrlC(), pytest.raises(AbortRun):
        signal.raise_signal(signal.SIGINT)


def test_after_a_step_the_first_ctrl_c_stops_the_second_aborts_later_ones_are_ignored() -> None:
    before = signal.getsignal(signal.SIGINT)
    with _CtrlC() as stop:
        assert stop.after_step(_Reporter(), 1, 2.0, 1e-3, {}) is False
        signal.raise_signal(signal.SIGINT)
        assert stop.requested
        assert stop.after_step(_Reporter(), 2, 2.0, 1e-3, {}) is True  # the loop stops
        with pytest.raises(AbortRun):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # the abort is unwinding: ignored
    assert signal.getsignal(signal.SIGINT) is before
