"""Where `slide train --out OUT` keeps its checkpoints, and how one becomes visible.

    OUT/.slide-run                  marker: OUT is Slide's (JSON: the top-level files it exported)
    OUT/checkpoints/step-000100/    a complete checkpoint (HF model, optimizer, slide_state.json)
    OUT/latest                      "checkpoints/step-000100": the newest published one
    OUT/config.json, model*.safetensors   hard links to the newest one's HF files (from_pretrained)
    OUT/config.toml                 the run's resolved flags (`slide train --config` reads it)

Invariants, for kill -9 at any instant:
- A checkpoint is complete or absent: it is written into `checkpoints/.tmp-step-N-PID/`, every
  file and the directory fsynced, and published by one rename; `latest` is replaced atomically
  after it. Only then is an older checkpoint removed (`keep` of them stay).
- Slide deletes only what it names itself: `step-*` and `.tmp-*` directories under
  `checkpoints/`, and the top-level files it exported. OUT is refused when it holds anything
  else, unless `--overwrite` (then Slide writes its files beside the others, touching nothing
  else).
- One writer per OUT, held by an flock on `OUT/.slide-lock`: a temporary directory found under
  the lock is a dead run's and is removed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from slide.errors import UserError
from slide.fileio import fsync_path, write_atomic

MARKER = ".slide-run"
LOCK = ".slide-lock"
LATEST = "latest"
CHECKPOINTS = "checkpoints"
STATE_FILE = "slide_state.json"
STEP_DIR = re.compile(r"step-(\d{6,})")
OWN_TOP_LEVEL = {MARKER, LOCK, LATEST, CHECKPOINTS}


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint `--resume PATH` means: OUT's latest published one, or PATH itself when it
    is a checkpoint directory (a `step-*` one, or a pre-`checkpoints/` OUT)."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"--resume {root}: no such directory")
    latest = root / LATEST
    if latest.is_file():
        target = root / latest.read_text(encoding="utf-8").strip()
        if (target / STATE_FILE).is_file():
            return target
    steps = published_steps(root / CHECKPOINTS)
    if steps:  # `latest` lost or stale (killed between the rename and its update)
        return root / CHECKPOINTS / step_dir_name(max(steps))
    if (root / STATE_FILE).is_file():
        return root
    raise UserError(
        f"--resume {root}: no checkpoint there (slide train --out writes {LATEST} and "
        f"{CHECKPOINTS}/step-N/{STATE_FILE})"
    )


def published_steps(checkpoints: Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(
        int(m.group(1))
        for d in checkpoints.iterdir()
        if (m := STEP_DIR.fullmatch(d.name)) and (d / STATE_FILE).is_file()
    )


class RunDir:
    """OUT, opened for one run's checkpoints. See the module docstring for the protocol."""

    def __init__(self, root: Path, *, keep: int, lineage: list[int]) -> None:
        self.root, self.keep, self.lineage = root, keep, lineage
        self.checkpoints = root / CHECKPOINTS
        self._lock_fd = -1

    @classmethod
    def open(
        cls, out: str | Path, *, keep: int, overwrite: bool, resumed: tuple[Path, int] | None
    ) -> RunDir:
        """Check OUT may be written (refusing before anything is created), lock it, clean up
        what a killed run left."""
        root = Path(out)
        lineage = cls.check(root, keep=keep, overwrite=overwrite, resumed=resumed)
        run = cls(root, keep=keep, lineage=lineage)
        run._lock()
        run._clean_partial()
        if not (root / MARKER).is_file():
            write_atomic(root / MARKER, json.dumps({"exported": []}))
        return run

    @staticmethod
    def check(
        out: str | Path, *, keep: int, overwrite: bool, resumed: tuple[Path, int] | None
    ) -> list[int]:
        """What `open` refuses, refused without creating anything; the lineage it continues."""
        if keep < 1:
            raise UserError(f"--keep must be at least 1 (checkpoints kept), got {keep}")
        root = Path(out)
        if root.exists() and not root.is_dir():
            raise UserError(f"--out {root} is a file: name a directory (new or Slide's own)")
        return _check_writable(root, overwrite=overwrite, resumed=resumed)

    def _lock(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                f"--out {self.root}: another slide train is writing there; wait for it or "
                "choose another directory"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _clean_partial(self) -> None:
        for d in self.checkpoints.iterdir():
            if d.name.startswith(".tmp-"):
                shutil.rmtree(d, ignore_errors=True)
        for f in self.root.iterdir():
            if f.name.startswith(".") and ".tmp-" in f.name and f.is_file():
                f.unlink()  # a top-level link a killed export left half-way

    def publish(self, step: int, write: Callable[[Path], list[str]]) -> Path:
        """Write a checkpoint with `write(directory) -> HF file names`, make it the latest,
        export its HF files to OUT, then drop checkpoints beyond `keep`."""
        name = step_dir_name(step)
        tmp = self.checkpoints / f".tmp-{name}-{os.getpid()}"
        tmp.mkdir()
        try:
            hf_files = write(tmp)
            fsync_path(tmp)
            target = self.checkpoints / name
            if target.exists():  # a checkpoint of an abandoned continuation: set it aside
                target.rename(self.checkpoints / f".tmp-replaced-{name}-{os.getpid()}")
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_path(self.checkpoints)
        write_atomic(self.root / LATEST, f"{CHECKPOINTS}/{name}\n")
        fsync_path(self.root)
        self.lineage = [s for s in self.lineage if s != step] + [step]
        self._export(target, hf_files)
        self._prune()
        return target

    def _export(self, ckpt: Path, files: list[str]) -> None:
        """Hard links (copies where the filesystem has none) of the HF files in OUT, each
        replaced atomically; files exported before and not now are removed."""
        marker = json.loads((self.root / MARKER).read_text(encoding="utf-8"))
        for name in files:
            tmp = self.root / f".{name}.tmp-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            try:
                os.link(ckpt / name, tmp)
            except OSError:
                shutil.copyfile(ckpt / name, tmp)
            os.replace(tmp, self.root / name)
        for name in set(marker.get("exported", [])) - set(files):
            (self.root / name).unlink(missing_ok=True)
        write_atomic(self.root / MARKER, json.dumps({"exported": sorted(files)}))
        fsync_path(self.root)

    def _prune(self) -> None:
        keep = {step_dir_name(s) for s in self.lineage[-self.keep :]}
        for d in self.checkpoints.iterdir():
            stale = STEP_DIR.fullmatch(d.name) and d.name not in keep
            if stale or d.name.startswith(".tmp-replaced-"):
                shutil.rmtree(d, ignore_errors=True)
        self.lineage = self.lineage[-self.keep :]
        fsync_path(self.checkpoints)


def _check_writable(root: Path, *, overwrite: bool, resumed: tuple[Path, int] | None) -> list[int]:
    """Refuse an OUT holding what Slide did not write, or another run's checkpoints; return
    the published steps this run continues (its lineage) when it resumes (checkpoint directory,
    steps done) from OUT."""
    if not root.exists() or not any(root.iterdir()):
        return []
    ours = (root / MARKER).is_file() or (root / STATE_FILE).is_file()
    if not ours and not overwrite:
        found = ", ".join(sorted(p.name for p in root.iterdir())[:4])
        raise UserError(
            f"--out {root} is not empty and was not written by slide train (it holds {found}): "
            "choose a new directory, or pass --overwrite to write Slide's files beside them "
            "(nothing else there is touched)"
        )
    steps = published_steps(root / CHECKPOINTS)
    if resumed is not None and resumed[0].resolve().is_relative_to(root.resolve()):
        return [s for s in steps if s <= resumed[1]]
    if steps and not overwrite:
        raise UserError(
            f"--out {root} already holds a checkpoint at step {max(steps)}: --resume {root} "
            "to continue it, or --overwrite to start a new run there (its checkpoints are "
            "removed once the new run has saved one)"
        )
    return []
