"""Saving a run's state as checkpoints of its `RunDir` while it trains.

At a step boundary the executor holds the next step back and hands over a reader of the state
(`executor.run.ReadState`: views of the live host buffers). When host RAM has room for a copy,
the state is copied (training waits only for the copy) and written by a background thread while
training goes on; otherwise training waits for the write itself (logged once, with the sizes).
Checkpoints are published in step order: a save first waits for the previous write, and a write
that failed is reported at the next save or at the end, as one line naming what was kept.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from executor.interrupts import CtrlCSafeThread
from executor.run import ReadState
from slide.checkpoints import STATE_FILE, RunDir
from slide.errors import StopRun
from slide.resume import OPTIM_FILE
from slide.weights import (
    WriteCancelled,
    meta_of,
    write_hf_model,
    write_safetensors,
    write_text,
)
from slide_ir.specs.model import ModelSpec

log = logging.getLogger(__name__)
SNAPSHOT_SHARE = 0.8  # of the host's available memory a snapshot may take

State = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]


class Checkpointer:
    """Publishes the state at a step boundary as one checkpoint of `run_dir` (see above)."""

    def __init__(self, run_dir: RunDir, writer: StateWriter) -> None:
        self.run_dir, self.writer = run_dir, writer
        self.last: Path | None = None
        self._thread: CtrlCSafeThread | None = None
        self._failure: StopRun | None = None
        self._cancel = threading.Event()
        self._warned = False

    def save(self, step: int, read_state: ReadState, *, background: bool = True) -> None:
        self.wait()
        weights, moments = read_state()
        if background and self._snapshot_fits(weights, moments):
            state = (_copied(weights), _copied(moments))  # training waits for this copy only
            self._thread = CtrlCSafeThread(
                target=self._write_in_background, args=(step, state), name="slide-checkpoint",
                daemon=True,  # a second Ctrl-C ends the process at once: the partial write goes
            )  # fmt: skip
            self._thread.start()
            return
        self._publish(step, (weights, moments))

    def wait(self) -> None:
        """Until the write in flight is published; re-raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def cancel(self) -> None:
        """Stop the write in flight (its partial directory is removed; the last published
        checkpoint stays): the run is being aborted, and a thread still writing when the
        interpreter exits would be killed inside C code."""
        if self._thread is not None:
            self._cancel.set()
            self._thread.join()
            self._thread = None

    def _write_in_background(self, step: int, state: State) -> None:
        try:
            self._publish(step, state)
        except StopRun as exc:
            self._failure = exc
        except WriteCancelled:
            log.info("checkpoint of step %d cancelled", step)

    def _publish(self, step: int, state: State) -> None:
        try:
            self.last = self.run_dir.publish(
                step, lambda d: self.writer.write(d, step, *state, cancel=self._cancel)
            )
        except OSError as exc:  # a full disk, a read-only mount: say where and what is kept
            kept = f"; the last checkpoint is {self.last}" if self.last else ""
            raise StopRun(
                f"error: cannot write the step-{step} checkpoint in {self.run_dir.root}: "
                f"{exc.strerror or exc}{kept}",
                code=1,
            ) from None
        log.info("checkpoint (%d steps) published at %s", step, self.last)

    def _snapshot_fits(self, *parts: Mapping[str, torch.Tensor]) -> bool:
        metas = (meta_of(p, name) for p in parts for name in p)  # nothing read to count it
        need = sum(t.numel() * t.element_size() for t in metas)
        available = available_memory_bytes()
        if need <= SNAPSHOT_SHARE * available:
            return True
        if not self._warned:
            self._warned = True
            log.warning(
                "checkpoints: a copy of the state (%.1f GiB) does not fit the %.1f GiB of host "
                "memory available; training waits for each checkpoint's write",
                need / 2**30,
                available / 2**30,
            )
        return False


class StateWriter:
    """What a checkpoint directory holds: the HF model in FP32 (the master weights themselves,
    so --resume continues exactly; `from_pretrained(..., dtype=torch.bfloat16)` gives a BF16
    copy), the Adam moments, `slide_state.json` (its text made by `state_text(step)`), and
    copies of `companions` (the tokenizer's files, generation_config.json), so that
    `AutoTokenizer.from_pretrained` loads the checkpoint too."""

    def __init__(
        self,
        spec: ModelSpec,
        state_text: Callable[[int], str],
        companions: Sequence[Path] = (),
    ) -> None:
        self.spec, self.state_text, self.companions = spec, state_text, tuple(companions)

    def write(
        self,
        directory: Path,
        step: int,
        weights: Mapping[str, torch.Tensor],
        moments: Mapping[str, torch.Tensor],
        *,
        cancel: threading.Event | None = None,
    ) -> list[str]:
        files = write_hf_model(directory, self.spec, weights, dtype=torch.float32, cancel=cancel)
        write_safetensors(directory / OPTIM_FILE, moments, cancel=cancel)
        write_text(directory / STATE_FILE, self.state_text(step))
        for source in self.companions:
            _copy_synced(source, directory / source.name)
        return files + [source.name for source in self.companions]


def _copy_synced(source: Path, target: Path) -> None:
    shutil.copyfile(source, target)
    with open(target, "rb") as f:
        os.fsync(f.fileno())


def _copied(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in tensors.items()}


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 where there is none: then nothing is copied)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
