"""`slide train`'s Ctrl-C rules, signal by signal: before the first step has finished there is
nothing to finish, so it aborts; after it, the first stops the run after the step in flight, a
second aborts, and later ones are ignored while the abort unwinds."""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from executor.interrupts import AbortRun
from slide.ctrl_c import CtrlC
from slide.saving import Checkpointer
from slide.weights import WriteCancelled


class _Reporter:
    def on_step(self, *step: object) -> None:
        pass


def test_before_the_first_step_ctrl_c_aborts() -> None:
    with CtrlC(), pytest.raises(AbortRun):
        signal.raise_signal(signal.SIGINT)


def test_after_a_step_the_first_ctrl_c_stops_the_second_aborts_later_ones_are_ignored() -> None:
    before = signal.getsignal(signal.SIGINT)
    with CtrlC() as stop:
        assert stop.after_step(_Reporter(), 1, 2.0, 1e-3, {}) is False
        signal.raise_signal(signal.SIGINT)
        assert stop.requested
        assert stop.after_step(_Reporter(), 2, 2.0, 1e-3, {}) is True  # the loop stops
        with pytest.raises(AbortRun):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # the abort is unwinding: ignored
    assert signal.getsignal(signal.SIGINT) is before


class _CheckpointInFlight:
    """A checkpoint whose cancel (joining its writer) gets a Ctrl-C halfway."""

    last = None
    cancelled = False

    def cancel(self) -> None:
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C, during the join
        self.cancelled = True


def test_a_ctrl_c_while_the_abort_cancels_the_checkpoint_is_ignored() -> None:
    from slide.errors import StopRun
    from slide.fine_tune import _stopping

    ckpt = _CheckpointInFlight()
    try:
        with _stopping(CtrlC(), ckpt):  # type: ignore[arg-type]
            signal.raise_signal(signal.SIGINT)  # before the first step: aborts at once
    except StopRun as stopped:
        assert stopped.code == 130 and ckpt.cancelled
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C during the checkpoint's cancel interrupted it")
    else:
        pytest.fail("the abort did not stop the run")


class _CancellableWrite:
    """A checkpoint write that runs until cancelled, then takes `tail_s` to stop."""

    tail_s = 0.3

    def __init__(self) -> None:
        self.started, self.ended = threading.Event(), threading.Event()

    def publish(self, step: int, write: Callable[[Path], list[str]]) -> Path:  # the RunDir's
        write(Path("unused"))
        raise AssertionError("the write was never cancelled")

    def write(self, directory: Path, step: int, *state: object, cancel: threading.Event) -> None:
        self.started.set()
        cancel.wait()
        time.sleep(self.tail_s)  # the tensor in flight
        self.ended.set()
        raise WriteCancelled


def test_a_ctrl_c_in_the_wait_for_a_checkpoint_leaves_its_cancel_waiting_for_the_writer() -> None:
    """The final save waits for the write in flight; a Ctrl-C there aborts and cancels it. The
    cancel must not return while the writer runs (the process would exit with it in C code:
    SIGABRT): CPython 3.11's interrupted `Thread.join` marked the writer stopped."""
    io = _CancellableWrite()
    ckpt = Checkpointer(io, io)  # type: ignore[arg-type]
    ckpt.save(1, lambda: ({"w": torch.zeros(4)}, {"m": torch.zeros(4)}))
    assert io.started.wait(10)
    ctrl_c = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ctrl_c.start()
        with pytest.raises(KeyboardInterrupt):
            ckpt.wait()
    finally:
        signal.signal(signal.SIGINT, before)
    ckpt.cancel()
    assert io.ended.is_set(), "cancel returned while the checkpoint's writer was still running"


# `slide train` with 2 s of the interpreter's shutdown held open (atexit runs in it)
SLOW_EXIT = ("import atexit, sys, time; atexit.register(time.sleep, 2.0); from slide.cli import "
             "main; sys.exit(main(sys.argv[1:]))")  # fmt: skip


def test_a_ctrl_c_once_the_run_is_over_is_ignored(tmp_path, tokens) -> None:
    """Sent after the summary is printed, as the process exits: it used to land in the
    interpreter's shutdown (exit -2, or a KeyboardInterrupt traceback) after a run that had
    succeeded."""
    cmd = [sys.executable, "-c", SLOW_EXIT, "train", "--device", "cpu", "--batch", "2", "--seq",
           "16", "--steps", "2", "--no-progress", "--data", tokens, "--out", str(tmp_path / "run")]  # fmt: skip
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.rstrip() == "}":  # the summary's last line
                time.sleep(0.5)
                proc.send_signal(signal.SIGINT)
                break
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "KeyboardInterrupt" not in err
