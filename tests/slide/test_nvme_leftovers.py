"""`slide train --optimizer nvme` killed by SIGKILL leaves its drive file (and, without
--nvme-dir, its scratch directory); the next run removes them, and nothing Slide did not
write. Real processes, on the CPU."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# `--placement small`: the search would keep the tiny model's whole state on the "GPU", none on disk
TRAIN = [sys.executable, "-m", "slide", "train", "--device", "cpu", "--no-progress", "--batch",
         "2", "--seq", "32", "--optimizer", "nvme", "--placement", "small", "--cpu-threads", "1"]  # fmt: skip


def killed_while_training(argv: list[str], env: dict[str, str], file_in: Path) -> None:
    run = subprocess.Popen([*TRAIN, "--steps", "100000", *argv], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(file_in.glob("**/nvme0.bin")) and time.monotonic() < deadline:
            assert run.poll() is None, "the run ended before it created its drive file"
            time.sleep(0.2)
        time.sleep(1.0)  # some steps in
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    assert list(file_in.glob("**/nvme0.bin")), "SIGKILL should leave the drive file"


def test_the_next_run_removes_a_killed_runs_drive_file(tmp_path, tokens):
    drive = tmp_path / "drive"
    drive.mkdir()
    (drive / "notes.txt").write_text("mine")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    killed_while_training(["--data", tokens, "--nvme-dir", str(drive)], env, drive)
    again = subprocess.run([*TRAIN, "--steps", "1", "--data", tokens, "--nvme-dir", str(drive)],
                           env=env, capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in drive.iterdir()) == ["notes.txt"]


def test_the_next_run_removes_a_killed_runs_scratch_dir(tmp_path, tokens):
    env = os.environ | {"OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    (tmp_path / "slide-nvme-foreign").mkdir()  # no owner in its name: not ours to judge
    killed_while_training(["--data", tokens], env, tmp_path)
    again = subprocess.run([*TRAIN, "--steps", "1", "--data", tokens], env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.glob("slide-nvme-*")) == ["slide-nvme-foreign"]
