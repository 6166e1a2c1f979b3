"""Completions: one per op, the only way lanes learn that another lane's op is done.

The edge types and their one mechanism each (STYLE §3):

- GPU -> GPU (both ops on CUDA streams): the waiter's stream `wait_event`s the op's CUDA event;
  the host never blocks (it only waits until the event has been *recorded*: waiting on an event
  not yet recorded would be a no-op on the device);
- GPU -> host (cpu / nvme lanes, the main thread): the host waits until recorded, then
  `event.synchronize()`;
- host -> anything: a lock held until the host work has finished (the completion's gate); a GPU
  lane's thread waits on it before enqueueing.

In CPU mode every op is host work, so every completion is a plain gate. Every wait polls a
shared abort flag, so one failing lane stops the others instead of deadlocking them.

The gate is a bare `threading.Lock`, not a `threading.Event`: an Event's Condition appends a
new lock per blocked wait to a deque of waiters, and CPython's deque moves along its 64-slot
block as waiters come and go; an op that two threads wait on at once (a lane and the main
thread) now and then crosses the block's end and takes a second 528-byte block, which the deque
keeps. Over the first thousands of steps, that was host memory growing by a block per op of
the graph (~30 B/step on tiny-llama, 1,757 ops). A lock wait allocates nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence

import torch

_POLL_S = 0.05
OnPoll = Callable[[], None] | None


class Aborted(Exception):
    """Raised inside a lane when another lane failed; the lane stops quietly."""


class WaitTimeout(TimeoutError):
    pass


class Completion:
    """Done-ness of one op. `start` and `event` are its CUDA events when the op runs on a
    stream: made with the completion, before the graph's first run, and recorded again by every
    repetition of the graph, so a run makes no events once it runs (`reset` readies the
    completion for the next repetition)."""

    __slots__ = ("_gate", "event", "op_id", "start")

    def __init__(self, op_id: str, on_stream: bool) -> None:
        self.op_id = op_id
        # held until the host work is done, or the GPU work enqueued and recorded
        self._gate = threading.Lock()
        self._gate.acquire()
        self.start: torch.cuda.Event | None = None
        self.event: torch.cuda.Event | None = None
        if on_stream:
            self.start = torch.cuda.Event(enable_timing=True)
            # blocking: a host waiting on it (the cpu lane on a gradient download, the main
            # thread at the step's end) sleeps instead of spinning on a core AdamW could use
            self.event = torch.cuda.Event(enable_timing=True, blocking=True)

    def gpu_events(self) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        """The (start, end) events a stream op records around its work."""
        assert self.start is not None and self.event is not None, f"{self.op_id} is not on a stream"
        return self.start, self.event

    def reset(self) -> None:
        """Not done: the op runs again (its events, if any, are recorded again). Only between
        repetitions, when the op is done and nothing waits on it."""
        if not self._gate.acquire(timeout=_POLL_S):  # a waiter may be between its take and give
            raise RuntimeError(f"{self.op_id}: reset while not done")

    def mark_done(self) -> None:
        """Host work finished, or the op's end event recorded on its stream."""
        self._gate.release()

    def wait_issued(
        self, abort: threading.Event, timeout_s: float, waiter: str, on_poll: OnPoll = None
    ) -> None:
        """`on_poll` runs each time the wait has lasted another `_POLL_S`, never with the gate
        taken (the main thread's deferred Ctrl-C: see `executor.interrupts`)."""
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        while not self._gate.acquire(timeout=_POLL_S):
            if on_poll is not None:
                on_poll()
            if abort.is_set():
                raise Aborted
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"{waiter} waited more than {timeout_s:g} s for {self.op_id}")
        self._gate.release()  # open again for the op's other waiters

    def wait_host(
        self, abort: threading.Event, timeout_s: float, waiter: str, on_poll: OnPoll = None
    ) -> None:
        """Block this thread until the op's work (host or device) has finished."""
        self.wait_issued(abort, timeout_s, waiter, on_poll)
        if self.event is not None:
            self.event.synchronize()

    def wait_stream(
        self, stream: torch.cuda.Stream, abort: threading.Event, timeout_s: float, waiter: str
    ) -> None:
        """Make `stream`'s later work wait for the op, blocking the host only for host ops."""
        self.wait_issued(abort, timeout_s, waiter)
        if self.event is not None:
            stream.wait_event(self.event)


class Completions:
    """Completion objects by op id, made up front (a few hundred bytes per op, and two CUDA
    events per op in `on_stream`)."""

    def __init__(self, op_ids: Sequence[str], on_stream: Collection[str] = ()) -> None:
        self._by_id = {op_id: Completion(op_id, op_id in on_stream) for op_id in op_ids}
        if on_stream:
            _create_cuda_events(self._by_id.values())

    def __getitem__(self, op_id: str) -> Completion:
        return self._by_id[op_id]

    def reset(self) -> None:
        for c in self._by_id.values():
            c.reset()


def _create_cuda_events(completions: Iterable[Completion]) -> None:
    """torch makes a CUDA event's driver object on its first record, not when the Python
    object is made; recording every event once here, on a stream of its own, keeps that host
    allocation out of the steady state (RSS rose 1.3 MB at the start of a 3B run's
    last pass, the first run of that pass's graph). A recorded event that is waited on or
    queried before the op records it again reads as done, as a never-recorded one does."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for c in completions:
            if c.event is not None:
                for event in c.gpu_events():
                    event.record()
    stream.synchronize()
