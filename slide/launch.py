"""`slide train --nproc N`: N data-parallel ranks, started the torchrun way, and how a rank ends.

    slide train --nproc 2 ...     checks the request as a rank would, then torch's elastic agent
      |- rank 0: python -m slide train --nproc 2 ...   progress, summary, every file written
      `- rank 1: python -m slide train --nproc 2 ...   its own errors only

The launcher is torchrun's machinery (`elastic_launch`: a standalone c10d rendezvous on a free
port of this host, no restarts). `torchrun --nproc-per-node N -m slide train ...` starts the
same ranks, on several hosts with torchrun's rendezvous flags: a process torchrun started
(WORLD_SIZE in its environment) is a rank, never a launcher.

Invariants:
- A rank's error is one line naming the rank, published to the other ranks (`Ranks.fail`: they
  name it instead of a broken connection) and to the agent (torchelastic's error file). The
  launcher exits with the code of the rank that failed (its own error before a peer's report)
  and adds a line only for a rank that could not say why (killed by a signal).
- Ctrl-C reaches the launcher only (the agent starts each rank in a session of its own), and
  the agent hands every rank one SIGINT: the ranks stop after the same step, rank 0 saves, all
  exit 130. A second Ctrl-C ends the launcher, and the ranks with it (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from slide.errors import StopRun, UserError

if TYPE_CHECKING:
    from executor.ranks import Ranks

LAUNCHER_PID = "SLIDE_LAUNCHER_PID"  # set for the ranks this launcher starts
SHUTDOWN_S = 3600  # after a Ctrl-C the agent waits this long for the ranks (rank 0's save)
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1


def torchrun_world() -> int | None:
    """The rank count when torchrun (or this launcher) started this process, else None."""
    world = os.environ.get("WORLD_SIZE")
    return None if world is None else int(world)


def launch(argv: Sequence[str], nproc: int, *, verbose: bool = False) -> int:
    """Run `slide *argv` as `nproc` ranks of this host; the exit code their end means."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"slide-{uuid.uuid4()}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
        shutdown_timeout=SHUTDOWN_S,
    )  # fmt: skip
    threads = max(1, (os.cpu_count() or 1) // nproc)  # the ranks share this host's cores
    env = {LAUNCHER_PID: str(os.getpid()), "OMP_NUM_THREADS": str(threads)}
    with _environ(env), _agent_quiet(verbose), _signals_restored():
        try:
            elastic_launch(config, sys.executable)("-m", "slide", *argv)
        except ChildFailedError as exc:
            return _ended(exc)
        except SignalException as exc:
            # a second signal while the agent waited for the ranks to stop (its handler
            # raised inside the first's): the ranks were then stopped with SIGTERM
            if isinstance(exc.__context__, SignalException):
                raise StopRun("aborted (ranks stopped); --out keeps its last checkpoint",
                              code=128 + int(exc.sigval)) from None  # fmt: skip
            return 128 + int(exc.sigval)  # the ranks stopped; rank 0 said what it saved
    return 0


def _ended(exc: object) -> int:
    """The exit code of the rank that failed first, or (StopRun) its line where it printed none."""
    failures = exc.failures  # type: ignore[attr-defined]  # {global rank: ProcessFailure}
    rank, failure = min(failures.items(), key=lambda kv: (_blame(kv[1]), kv[1].timestamp, kv[0]))
    said = failure.error_file_data
    if "code" in said:  # it printed its line (and may have been stopped by the agent since)
        return int(said["code"])
    if failure.exitcode < 0:
        raise StopRun(f"rank {rank}: killed by {failure.signal_name()}",
                      code=128 - int(failure.exitcode))  # fmt: skip
    raise StopRun(f"rank {rank}: exited with code {failure.exitcode}", code=failure.exitcode)


def _blame(failure: Any) -> int:
    """Which rank's failure is the cause: its own known error; killed by a signal the agent
    does not send (SIGKILL: out of memory?); a crash (the peers' collectives then break);
    last, a peer's report or a stop by the agent."""
    cause = failure.error_file_data.get("cause")
    if cause is not None:
        return {"own": 0, "crash": 2}.get(cause, 4)
    killed = failure.exitcode < 0 and -failure.exitcode not in (signal.SIGTERM, signal.SIGINT)
    return 1 if killed else 3


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ (the ranks inherit it) while the agent runs; OMP_NUM_THREADS
    only where the user set none."""
    values = {k: v for k, v in values.items() if k == LAUNCHER_PID or k not in os.environ}
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _agent_quiet(verbose: bool) -> Iterator[None]:
    """The agent logs each rank it starts and stops; the ranks say what matters themselves."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", *names)]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO if verbose else logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def _signals_restored() -> Iterator[None]:
    """The agent's handlers (raising on SIGINT, SIGTERM, ...) are not left behind."""
    before = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


# -- inside a rank --------------------------------------------------------------------------
def die_with_launcher() -> None:
    """A rank Slide's launcher started is killed when the launcher ends (a second Ctrl-C)."""
    if os.environ.get(LAUNCHER_PID) != str(os.getppid()) or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def rank_errors(ranks: Ranks) -> Iterator[None]:
    """A known error becomes one line naming this rank, published to the other ranks and the
    agent; an error a peer's failure caused names that peer; an interruption is reported by
    rank 0 alone; any other exception keeps its traceback (a bug), published too."""
    from executor.ranks import RankFailure
    from executor.run import InfeasiblePlanError

    try:
        yield
    except (KeyboardInterrupt, StopRun) as exc:
        code = exc.code if isinstance(exc, StopRun) else 130
        if code in (0, 130):
            if ranks.is_main:
                raise
            raise StopRun("", code=code) from None
        _fail(ranks, str(exc), code)
    except RankFailure as exc:  # another rank's failure stopped this one
        _fail(ranks, f"error: {exc}", 1, cause="peer")
    except (UserError, ValueError, FileNotFoundError, InfeasiblePlanError) as exc:
        _fail(ranks, f"error: {exc}", 2)
    except Exception as exc:
        failure = ranks.settle(exc)  # this rank's own error is published by it
        if failure is not None:
            _fail(ranks, f"error: {failure}", 1, cause="peer")
        _error_file(f"rank {ranks.rank}: {type(exc).__name__}: {exc}", 1, cause="crash")
        raise


def _fail(ranks: Ranks, message: str, code: int, *, cause: str = "own") -> None:
    if cause == "own":
        ranks.fail(message)
    line = f"rank {ranks.rank}: {message}"
    _error_file(line, code, cause=cause)
    raise StopRun(line, code=code) from None


def _error_file(message: str, code: int, *, cause: str) -> None:
    """torchelastic's error file: the agent (and torchrun's report) read the rank's error;
    `cause`: own (a known error of this rank), peer (another rank's), crash (a traceback)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        said = {"message": message, "timestamp": int(time.time()), "code": code,
                "cause": cause}  # fmt: skip
        with open(path, "w", encoding="utf-8") as f:
            json.dump(said, f)
