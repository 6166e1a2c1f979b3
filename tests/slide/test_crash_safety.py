"""`slide train --save-every 1` killed for real: SIGKILL at seeded random instants and while each
checkpoint file is being written, SIGINT once and twice. After every trial a checkpoint exists
once one had been published, it loads, and resuming it to the end gives weights and moments
bitwise equal to an uninterrupted run (one thread everywhere: where CPU runs are reproducible).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from slide.checkpoints import find_checkpoint, published_steps
from slide.cli import main

STEPS = 5
ARGS = ["train", "--device", "cpu", "--batch", "2", "--seq", "32", "--lr", "1e-3",
        "--no-shuffle", "--no-progress", "--cpu-threads", "1", "--steps", str(STEPS),
        "--save-every", "1"]  # fmt: skip
DELAY_MS = "3"  # per tensor written: a save of tiny-llama takes ~0.4 s, each file >= 30 ms
FILES = ("model.safetensors", "optimizer.safetensors", "slide_state.json")
RANDOM_KILLS, TARGETED_KILLS_PER_FILE, INTERRUPTS = 15, 5, 10


@dataclass
class Trial:
    out: Path
    how: str  # "kill@random", "kill@<file>", "int", "int-int"
    code: int = 0
    stderr: str = ""
    published_before: bool = False  # a checkpoint had been published when the signal was sent
    hit: str = ""  # the file a killed save was writing (from its partial directory)


@pytest.fixture(scope="module")
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens, single_thread):
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main([*ARGS, "--data", tokens, "--out", str(out)]) == 0
    return _final_state(out)


def _final_state(out: Path) -> dict[str, torch.Tensor]:
    ckpt = find_checkpoint(out)
    assert json.loads((ckpt / "slide_state.json").read_text())["steps_done"] == STEPS
    return load_file(str(ckpt / "model.safetensors")) | load_file(
        str(ckpt / "optimizer.safetensors")
    )


def _start(trial: Trial, tokens: str) -> subprocess.Popen[str]:
    env = os.environ | {"OMP_NUM_THREADS": "1", "SLIDE_SAVE_DELAY_MS": DELAY_MS,
                        "PYTHONFAULTHANDLER": "1"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "slide.cli", *ARGS, "--data", tokens, "--out", str(trial.out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _writing(out: Path) -> str:
    """The file a save in progress is writing: the last of FILES its partial directory holds."""
    for partial in (out / "checkpoints").glob(".tmp-step-*"):
        present = [f for f in FILES if (partial / f).exists()]
        return present[-1] if present else "config.json"
    return ""


def _wait_for(proc: subprocess.Popen[str], ready, timeout: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if ready():
            return True
        time.sleep(0.002)
    return False


def _finish(proc: subprocess.Popen[str], trial: Trial) -> str:
    """The process's stderr once it has ended; one that hangs is aborted and fails the test
    with every thread's stack (PYTHONFAULTHANDLER)."""
    try:
        return proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail(f"{trial.how} in {trial.out} hung; its stacks:\n{proc.communicate()[1]}")


def _run_trial(trial: Trial, tokens: str, rng: random.Random) -> Trial:
    """One trial; a targeted kill whose run ended before the target was seen (a loaded
    machine's poll can miss a write) is tried again, in a fresh directory, up to 3 times."""
    target = trial.how.removeprefix("kill@")  # in a save after the first was published
    for attempt in range(3):
        proc = _start(trial, tokens)
        started = _wait_for(proc, lambda: (trial.out / "checkpoints").is_dir())
        assert started, f"{trial.how}: the run never opened its --out"
        if trial.how in ("kill@random", "int", "int-int"):
            time.sleep(rng.uniform(0.0, 2.5))
            break
        _wait_for(proc, lambda: (trial.out / "latest").exists())
        if _wait_for(proc, lambda: _writing(trial.out) == target):
            break
        _finish(proc, trial)
        trial.out = trial.out.with_name(f"{trial.out.name}-again{attempt}")
    trial.published_before = (trial.out / "latest").exists()
    if trial.how.startswith("kill"):
        trial.hit = _writing(trial.out)
        proc.send_signal(signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGINT)
        if trial.how == "int-int":
            time.sleep(rng.uniform(0.0, 0.3))
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
    trial.stderr = _finish(proc, trial)
    trial.code = proc.returncode
    return trial


def _trials(root: Path) -> list[Trial]:
    hows = ["kill@random"] * RANDOM_KILLS
    hows += [f"kill@{f}" for f in FILES for _ in range(TARGETED_KILLS_PER_FILE)]
    hows += ["int"] * (INTERRUPTS - 3) + ["int-int"] * 3
    return [Trial(out=root / f"t{k:02d}", how=how) for k, how in enumerate(hows)]


def test_killed_and_interrupted_runs_resume_bitwise(tmp_path, tokens, reference, single_thread):
    trials = _trials(tmp_path)
    rngs = [random.Random(k) for k in range(len(trials))]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(
            pool.map(lambda tr: _run_trial(tr[0], tokens, tr[1]), zip(trials, rngs, strict=True))
        )
    hits = {t.hit for t in done if t.how.startswith("kill") and t.published_before}
    assert set(FILES) <= hits, f"no kill landed while writing each file over a checkpoint: {hits}"
    for t in done:
        _check_trial(t, tokens, reference)


def _described(t: Trial) -> str:
    """The trial, its exit code and its stderr's end, or from a fatal error on (its cause and
    every thread's stack come before the modules faulthandler lists last)."""
    fatal = t.stderr.find("Fatal Python error")
    err = t.stderr[fatal : fatal + 4000] if fatal >= 0 else t.stderr[-300:]
    return f"{t.how} ({t.out.name}, exit {t.code}, stderr {err!r})"


def _check_trial(t: Trial, tokens: str, reference: dict[str, torch.Tensor]) -> None:
    what = _described(t)
    assert "Traceback" not in t.stderr, what
    if t.how.startswith("kill@") and t.how != "kill@random":
        assert t.code == -signal.SIGKILL, what
    elif t.how == "kill@random":  # the run may have ended before the signal landed
        assert t.code in (0, -signal.SIGKILL), what
    else:
        assert t.code in (0, 130), what
        if t.code == 130:
            assert "interrupted after step" in t.stderr or "aborted" in t.stderr, what
    assert not (t.out / "notes.txt").exists()
    published = (t.out / "latest").exists() or any((t.out / "checkpoints").glob("step-*"))
    if t.published_before:
        assert published, f"{what}: a published checkpoint was lost"
    if published:
        ckpt = find_checkpoint(t.out)
        assert json.loads((ckpt / "slide_state.json").read_text())["steps_done"] >= 1
        load_file(str(ckpt / "model.safetensors"))  # whole and readable
        load_file(str(ckpt / "optimizer.safetensors"))
    resume = ["--resume", str(t.out)] if published else []
    code = main([*ARGS, "--data", tokens, "--out", str(t.out), *resume])
    assert code == 0, what
    got = _final_state(t.out)
    assert got.keys() == reference.keys(), what
    unequal = [k for k in got if not torch.equal(got[k], reference[k])]
    assert not unequal, f"{what}: resumed state differs in {unequal[:3]}"


# -- global clipping: SIGKILL at chosen points of a step whose updates wait for its norm ------
CLIP_ARGS = [*ARGS, "--clip", "global", "--clip-norm", "0.05", "--save-every", "2"]
# Run in the killed process before `slide train`: an update of global step $PARK_STEP, once
# $PARK_AFTER of that step's updates have started, writes the op's id to $PARK_FILE and blocks
# its lane for good (the norm is known, the step's updates are part done, the state in RAM is
# half-updated); the micro-batches of the steps in $POISON_STEPS are scaled by NaN, so their
# gradient norm is not finite and global clipping skips them.
HOOK = """import os, sys, threading
from pathlib import Path
from executor import repetition
from executor.env import Env, MicroBatch

park, after = int(os.environ.get("PARK_STEP", "0")), int(os.environ.get("PARK_AFTER", "0"))
poison = {int(s) for s in os.environ.get("POISON_STEPS", "").split(",") if s}
started = []
update_scale = Env.update_scale

def parked(self, op):
    if self.step_offset + op.step == park:
        if len(started) == after:
            Path(os.environ["PARK_FILE"]).write_text(op.id)
            threading.Event().wait()
        started.append(op.id)
    return update_scale(self, op)

real_micro_batches = repetition.micro_batches

def poisoned(it, step, info, base, *args, **kwargs):
    out = real_micro_batches(it, step, info, base, *args, **kwargs)
    if base + step in poison:
        out = [MicroBatch(step=m.step, micro=m.micro, scale=float("nan")) for m in out]
    return out

Env.update_scale = parked
repetition.micro_batches = poisoned
from slide.cli import main
sys.exit(main(sys.argv[1:]))
"""


# 5 resident + 1 sliding; host updates; host updates speculating, so a kill in the backward
# falls between a speculative update and the REDO that validates it
PLACEMENTS = {"mixed": [], "sliding": ["--resident", "0"],
              "speculated": ["--resident", "0", "--speculate", "99"]}  # fmt: skip


def _hooked(out: Path, tokens: str, placement: str, **env: str) -> subprocess.Popen[str]:
    env = os.environ | {"OMP_NUM_THREADS": "1", "SLIDE_SAVE_DELAY_MS": DELAY_MS,
                        "PYTHONFAULTHANDLER": "1", **env}  # fmt: skip
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOOK,
            *CLIP_ARGS,
            *PLACEMENTS[placement],
            "--data",
            tokens,
            "--out",
            str(out),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _clip_reference(
    out: Path, tokens: str, placement: str, poison: str = ""
) -> tuple[dict[str, torch.Tensor], str]:
    """The final state of an uninterrupted clipped run (in a process of its own, hooked as
    the killed ones are, parking nowhere) and its stderr."""
    proc = _hooked(out, tokens, placement, POISON_STEPS=poison)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == 0, stderr[-2000:]
    return _final_state(out), stderr


@pytest.fixture(scope="module")
def clip_references(tmp_path_factory, tokens):
    """placement -> the uninterrupted clipped run's final state, made on first use."""
    made: dict[str, dict[str, torch.Tensor]] = {}

    def of(placement: str) -> dict[str, torch.Tensor]:
        if placement not in made:
            out = tmp_path_factory.mktemp(f"clip-ref-{placement}") / "run"
            made[placement] = _clip_reference(out, tokens, placement)[0]
        return made[placement]

    return of


def _kill_parked(
    out: Path, tokens: str, placement: str, step: int, after: int, poison: str = ""
) -> Trial:
    """Start a clipped run, wait until its lane parks in step `step`'s updates (`after` of them
    started), SIGKILL it there."""
    trial = Trial(out=out, how=f"kill@s{step}.update{after} ({placement})")
    park = out.parent / f"{out.name}.parked"
    proc = _hooked(out, tokens, placement, PARK_STEP=str(step), PARK_AFTER=str(after),
                   PARK_FILE=str(park), POISON_STEPS=poison)  # fmt: skip
    parked = _wait_for(proc, park.exists, timeout=300)
    assert parked, (
        f"{trial.how}: the run never reached step {step}'s updates:\n{_finish(proc, trial)}"
    )
    trial.published_before = (out / "latest").exists()
    proc.send_signal(signal.SIGKILL)
    trial.stderr = _finish(proc, trial)
    trial.hit = _writing(out)  # a background write the kill cut short, if any
    trial.code = proc.returncode
    return trial


def _check_clip_trial(
    t: Trial, tokens: str, placement: str, reference: dict[str, torch.Tensor], step: int
) -> None:
    """The checkpoints published are those due before `step` (the killed step reached no save);
    the newest is the last due, or the one before it where the kill cut the last one's
    background write; it loads, and `--resume` gives the uninterrupted run's state bit for bit."""
    what = _described(t)
    assert t.code == -signal.SIGKILL, what
    assert "Traceback" not in t.stderr, what
    due = list(range(2, step, 2))  # --save-every 2
    published = published_steps(t.out / "checkpoints")
    assert set(published) <= set(due), what
    assert published or len(due) < 2, f"{what}: a checkpoint whose write had ended was lost"
    resume: list[str] = []
    if published:
        ckpt = find_checkpoint(t.out)
        state = json.loads((ckpt / "slide_state.json").read_text())
        assert state["steps_done"] == max(published) and state["steps_done"] in due[-2:], what
        assert state["config"]["clip"] == "global", what
        load_file(str(ckpt / "optimizer.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(ckpt)  # whole and loadable as HF
        assert all(torch.isfinite(p).all() for p in model.parameters()), what
        resume = ["--resume", str(t.out)]
    argv = [*CLIP_ARGS, *PLACEMENTS[placement], "--data", tokens, "--out", str(t.out), *resume]
    assert main(argv) == 0, what
    got = _final_state(t.out)
    assert got.keys() == reference.keys(), what
    unequal = [k for k in got if not torch.equal(got[k], reference[k])]
    assert not unequal, f"{what}: resumed state differs in {unequal[:3]}"


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize(
    ("step", "after"), [(1, 0), (2, 0), (3, 0), (3, 2), (4, 1), (5, 3)], ids=lambda v: str(v)
)
def test_killed_in_a_globally_clipped_steps_updates_resumes_bitwise(
    tmp_path, tokens, clip_references, single_thread, placement, step, after
):
    """Killed once the step's norm is known and `after` of its deferred updates have started
    (the rest waiting): in the first step, on a save step before its save, just after a save
    (whose background write the kill may cut), in the last step."""
    trial = _kill_parked(tmp_path / "run", tokens, placement, step, after)
    _check_clip_trial(trial, tokens, placement, clip_references(placement), step)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_a_skipped_step_stays_skipped_across_a_kill_and_resume(
    tmp_path, tokens, single_thread, placement
):
    """Step 2's gradients NaN: global clipping skips it, and Adam's bias correction counts the
    updates made. Killed in step 5 (after the checkpoint of step 2, maybe of step 4), resumed:
    the state is the uninterrupted run's bit for bit, so the resume counted step 2 as skipped."""
    reference, stderr = _clip_reference(tmp_path / "ref" / "run", tokens, placement, poison="2")
    assert "step 2: the gradient norm is nan: step skipped" in stderr
    trial = _kill_parked(tmp_path / "run", tokens, placement, 5, 1, poison="2")
    ckpt = find_checkpoint(trial.out)
    assert json.loads((ckpt / "slide_state.json").read_text())["skipped_steps"] == [2]
    _check_clip_trial(trial, tokens, placement, reference, 5)
