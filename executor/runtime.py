"""Lane workers: one thread per lane of the Graph, walking that lane's ops in list order.

    main thread ──feeds micro-batches──► gpu lane ─┐  streams (CUDA): gpu = compute,
                ◄──waits step s's ops───  h2d lane ─┤  h2d, d2h = copy engines;
                                          d2h lane ─┤  cpu, nvme{k}: host threads
                                          cpu lane ─┘

Per op a worker (1) optionally sleeps (race knob) or waits for the previous op of the list
(serial knob), (2) waits for the op's dependencies by their edge type (see `completion`), (3)
runs the handler of its kind, (4) records a span and marks the op's completion. The executor
adds no ordering of its own. A failing lane adds a note naming the op, sets the abort flag that
every wait polls, and the main thread re-raises its exception after joining the lanes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from executor import knobs as knobs_mod
from executor.adam import HostScratch
from executor.completion import Aborted, Completions
from executor.env import Env, LaneState
from executor.handlers import Handler, lower
from executor.interrupts import DeferredInterrupts
from executor.recording import Recorder
from slide_ir.ir.graph import Graph, Op, Role, lane_kind

log = logging.getLogger("executor.runtime")

# lanes whose ops are enqueued on a CUDA stream of their own: `net` too, for NCCL's collectives
# are asynchronous to the host like the copies (done when the stream's event is)
GPU_LANE_KINDS = ("gpu", "h2d", "d2h", "net")


def on_stream(env: Env, lane: str) -> bool:
    """Whether `lane`'s ops are enqueued on a CUDA stream (and so have CUDA events)."""
    return env.cuda and lane_kind(lane) in GPU_LANE_KINDS


@dataclass(kw_only=True)
class Shared:
    """What all lane threads of one run share (read-only but for the error slot)."""

    env: Env
    graph: Graph
    handlers: dict[str, Handler]  # op id -> its handler (`handlers.lower`)
    completions: Completions
    recorder: Recorder
    knobs: knobs_mod.Knobs
    previous: dict[str, str]  # op id -> the op before it in the list (serial knob)
    by_step: dict[int, list[str]]  # step -> its ops' ids: what the main thread waits on
    fed: dict[tuple[int, int], str]  # (step, micro) -> the host token slot its embedding reads
    host_losses: dict[int, str]  # step -> the slot of its loss's host copy
    by_lane: dict[str, tuple[Op, ...]]  # lane -> its ops in order: what its worker walks
    error: list[BaseException]
    error_lock: threading.Lock

    def rerun(self) -> None:
        """Ready the graph for its next repetition, once every op of this one is done and the
        recorder has resolved them: each op's events are recorded again, and a lane puts an
        op's marks to the recorder before marking it done, so none is re-recorded unread."""
        self.completions.reset()

    def fail(self, exc: BaseException) -> None:
        with self.error_lock:
            self.error.append(exc)
        self.env.abort.set()


class LaneWorker(threading.Thread):
    """One lane's thread for the whole run: it walks its ops of each repetition of the graph
    handed to it (a `Shared`), in turn, until it is handed None. Its stream, optimizer scratch
    and intra-op thread pool live as long as it does: a new CUDA stream per repetition would
    strand the caching allocator's blocks on the old one (on the H200, 3.3 GB more reserved
    every 16 steps of a 3B run)."""

    def __init__(self, lane: str, env: Env, knobs: knobs_mod.Knobs, cpu_threads: int | None):
        super().__init__(name=f"slide-{lane}", daemon=True)
        self.lane, self.env, self.cpu_threads = lane, env, cpu_threads
        self.on_stream = on_stream(env, lane)
        self.rng = random.Random(f"{knobs.delay_seed}:{lane}")
        self.state = LaneState(lane=lane)
        self.inbox: queue.Queue[Shared | None] = queue.Queue()

    def _setup(self) -> None:
        env = self.env
        if env.cuda:
            torch.cuda.set_device(env.device)
        if self.on_stream:
            self.state.stream = torch.cuda.Stream(device=env.device)
        if lane_kind(self.lane) == "cpu":
            if self.cpu_threads:
                torch.set_num_threads(self.cpu_threads)
            self.state.scratch = HostScratch(env.moments_bf16)

    def run(self) -> None:
        op: Op | None = None
        ready = False
        while (shared := self.inbox.get()) is not None:
            self.shared = shared
            try:
                if not ready:
                    self._setup()
                    ready = True
                for op in shared.by_lane.get(self.lane, ()):  # an eval graph uses fewer lanes
                    self._run_op(op)
            except Aborted:
                return
            except BaseException as exc:  # every failure stops the run; the main thread re-raises
                where = f"while running {op.id} on {self.lane}" if op else f"starting {self.lane}"
                exc.add_note(where)
                shared.fail(exc)
                return

    def _before(self, op: Op) -> None:
        s = self.shared
        if s.knobs.random_delay_ms > 0:
            time.sleep(self.rng.uniform(0.0, s.knobs.random_delay_ms) / 1e3)
        prev = s.previous.get(op.id)
        if s.knobs.serial and prev is not None:
            s.completions[prev].wait_host(s.env.abort, s.knobs.wait_timeout_s, op.id)

    def _run_op(self, op: Op) -> None:
        s, env = self.shared, self.shared.env
        self._before(op)
        handler = s.handlers[op.id]
        done = s.completions[op.id]
        timeout = s.knobs.wait_timeout_s
        if not self.on_stream:
            for dep in op.deps:
                s.completions[dep].wait_host(env.abort, timeout, op.id)
            start = time.perf_counter()
            handler(env, self.state, op)
            end = time.perf_counter()
            s.recorder.put(op, start, end)  # before the op is done: see `Shared.rerun`
            done.mark_done()
            return
        stream = self.state.stream
        with torch.cuda.stream(stream), _nvtx(op.id):
            for dep in op.deps:
                s.completions[dep].wait_stream(stream, env.abort, timeout, op.id)
            start_ev, end_ev = done.gpu_events()
            start_ev.record(stream)
            handler(env, self.state, op)
            end_ev.record(stream)
        s.recorder.put(op, start_ev, end_ev)
        done.mark_done()


@contextlib.contextmanager
def _nvtx(name: str) -> Iterator[None]:
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


def make_shared(env: Env, graph: Graph, recorder: Recorder) -> Shared:
    """Everything a run of `graph` needs besides the lanes, made before it runs (its ops'
    completions and CUDA events too), so that a pass allocates nothing on any thread."""
    ops = graph.ops
    by_step: dict[int, list[str]] = {}
    for op in ops:
        by_step.setdefault(op.step, []).append(op.id)
    return Shared(
        env=env,
        graph=graph,
        handlers=lower(graph),
        completions=Completions(
            [op.id for op in ops],
            {op.id for op in ops if on_stream(env, op.lane)},
        ),
        recorder=recorder,
        knobs=knobs_mod.from_env(),
        previous={b.id: a.id for a, b in itertools.pairwise(ops)},
        by_step=by_step,
        fed={(op.step, op.micro): v.slot for op in ops if (v := op.read_as(Role.FEED))},
        host_losses={op.step: v.slot for op in ops if (v := op.written_as(Role.HOST_LOSS))},
        by_lane={lane: graph.lane_ops(lane) for lane in graph.lanes()},
        error=[],
        error_lock=threading.Lock(),
    )


JOIN_FAILED_RANK_S = 10.0


class Lanes:
    """The run's lane workers: started once, handed each repetition of the graph in turn."""

    def __init__(self, env: Env, lanes: tuple[str, ...], cpu_threads: int | None) -> None:
        knobs = knobs_mod.from_env()
        self.workers = [LaneWorker(lane, env, knobs, cpu_threads) for lane in lanes]
        for w in self.workers:
            w.start()

    def run(self, shared: Shared) -> None:
        """Start the lanes on `shared`'s graph (they must have finished the previous one): a
        training pass's, or an eval pass's, which may leave some lanes without an op."""
        assert set(shared.graph.lanes()) <= {w.lane for w in self.workers}
        for w in self.workers:
            w.inbox.put(shared)

    def stop(self, shared: Shared | None, *, abort: bool) -> None:
        """Join every lane (aborting the ones still waiting when `abort`); re-raise a lane's
        error."""
        if abort and shared is not None:
            shared.env.abort.set()
        for w in self.workers:
            w.inbox.put(None)
        # a failing rank's lane may be inside a collective its peers will never join: it is
        # left behind (a daemon) so the process can exit and close its connections
        stuck_after = JOIN_FAILED_RANK_S if abort and shared and shared.env.ranks else None
        for w in self.workers:
            w.join(stuck_after)
        if shared is not None and shared.error:
            raise shared.error[0]


def wait_ops(shared: Shared, op_ids: list[str], interrupts: DeferredInterrupts) -> None:
    """Block the main thread until these ops have finished (host and device work); a Ctrl-C
    counted before or during the wait is handed on here (it may raise KeyboardInterrupt)."""
    interrupts.deliver()
    for op_id in op_ids:
        shared.completions[op_id].wait_host(
            shared.env.abort, shared.knobs.wait_timeout_s, "main", interrupts.deliver
        )
