"""Ctrl-C as the main thread's wait ends: the moment a CI run of `slide train` hung at (the
wait had taken the op's gate when the interrupt raised, so the op never read as done again)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType, SimpleNamespace

import pytest
from runs import assert_bitwise_equal, graph_of, run_executor

from executor.completion import Completion
from executor.interrupts import AbortRun, DeferredInterrupts
from executor.runtime import wait_ops

STEPS = 6


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler (raise KeyboardInterrupt), whatever the runner installed."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _main_waits_on(op_id: str, main: int) -> bool:
    frame = sys._current_frames().get(main)
    while frame is not None:
        if frame.f_code.co_name == "wait_issued":
            return bool(frame.f_locals["self"].op_id == op_id)
        frame = frame.f_back
    return False


def _interrupt_as_done(monkeypatch: pytest.MonkeyPatch, op_id: str) -> list[bool]:
    """Make the lane that finishes `op_id` wait until the main thread waits on it, mark it done
    and send SIGINT to the main thread as it wakes. (An op comes after every op it depends on in
    the graph's order, so the main thread, waiting on a step's ops in that order, gets to it.)"""
    main, sent, mark_done = threading.main_thread().ident, [], Completion.mark_done
    assert main is not None

    def mark_done_then_interrupt(self: Completion) -> None:
        if self.op_id != op_id or sent:
            mark_done(self)
            return
        end = time.monotonic() + 10.0
        while not _main_waits_on(op_id, main):
            assert time.monotonic() < end, f"the main thread never waited on {op_id}"
            time.sleep(0.001)
        mark_done(self)
        busy_until = time.perf_counter() + 0.001  # holding the GIL: the main thread has the
        while time.perf_counter() < busy_until:  # gate, and waits for the GIL to return with it
            pass
        sent.append(True)
        signal.pthread_kill(main, signal.SIGINT)

    monkeypatch.setattr(Completion, "mark_done", mark_done_then_interrupt)
    return sent


def _interrupt_as_step_1_ends(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """`_interrupt_as_done` on step 1's last op; a lost gate fails the run in 20 s."""
    monkeypatch.setenv("SLIDE_WAIT_TIMEOUT_S", "20")
    last_of_step_1 = [op.id for op in graph_of(False, steps=STEPS).ops if op.step == 1][-1]
    return _interrupt_as_done(monkeypatch, last_of_step_1)


def test_ctrl_c_as_a_steps_last_op_ends_stops_the_run_cleanly(
    monkeypatch: pytest.MonkeyPatch, python_sigint: None
) -> None:
    """The run stops after the steps it had started, as an uninterrupted run of as many steps,
    instead of waiting forever (here: until the wait's 20 s limit) on the step's last op."""
    sent = _interrupt_as_step_1_ends(monkeypatch)
    stopped = run_executor(False, steps=STEPS)
    assert sent, "step 1's last op never ran"
    assert stopped.interrupted
    assert stopped.steps_done < STEPS  # the steps already fed also finish
    monkeypatch.undo()
    assert_bitwise_equal(stopped, run_executor(False, steps=stopped.steps_done))


def test_an_abort_in_a_steps_wait_ends_the_run_at_once(
    monkeypatch: pytest.MonkeyPatch, python_sigint: None
) -> None:
    """`AbortRun` (what `slide train` raises for a Ctrl-C before the first step has finished,
    or a second one) goes through the loop, where a plain KeyboardInterrupt finishes the steps."""

    def abort(signum: int, frame: FrameType | None) -> None:
        raise AbortRun

    signal.signal(signal.SIGINT, abort)
    sent = _interrupt_as_step_1_ends(monkeypatch)
    with pytest.raises(AbortRun):
        run_executor(False, steps=STEPS)
    assert sent


def test_a_ctrl_c_as_the_gate_opens_is_raised_after_the_wait_and_the_op_stays_done(
    python_sigint: None,
) -> None:
    """The same moment without the run, 50 times: a lane marks the op done and at once sends
    SIGINT. Raised by Python's handler inside the wait, this lost the gate every time."""
    main = threading.main_thread().ident
    assert main is not None
    abort = threading.Event()
    for _ in range(50):
        done = Completion("s1.op", on_stream=False)
        shared = SimpleNamespace(
            completions={"s1.op": done}, env=SimpleNamespace(abort=abort),
            knobs=SimpleNamespace(wait_timeout_s=5.0),
        )  # fmt: skip
        go = threading.Event()

        def finish(done: Completion = done, go: threading.Event = go) -> None:
            go.wait()
            time.sleep(0.002)
            done.mark_done()
            signal.pthread_kill(main, signal.SIGINT)

        lane = threading.Thread(target=finish)
        lane.start()
        with pytest.raises(KeyboardInterrupt), DeferredInterrupts() as interrupts:
            go.set()
            wait_ops(shared, ["s1.op"], interrupts)  # type: ignore[arg-type]
            lane.join()
        lane.join()
        done.wait_host(abort, 1.0, "test")  # WaitTimeout if the gate was lost


def test_deferred_sigint_reaches_the_replaced_handler_once_each(python_sigint: None) -> None:
    seen: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    with DeferredInterrupts() as interrupts:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        assert seen == [] and interrupts.pending == 2  # counted, not yet handed on
        interrupts.deliver()
        assert seen == [signal.SIGINT] * 2
        signal.raise_signal(signal.SIGINT)
    assert seen == [signal.SIGINT] * 3  # the one left when the context ended, too
    signal.raise_signal(signal.SIGINT)
    assert seen == [signal.SIGINT] * 4  # the replaced handler is back


def test_deferred_sigint_raises_only_in_deliver(python_sigint: None) -> None:
    with DeferredInterrupts() as interrupts:
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.01)  # Python's handler would have raised by now
        with pytest.raises(KeyboardInterrupt):
            interrupts.deliver()
        assert interrupts.pending == 0
