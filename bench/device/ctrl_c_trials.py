"""Ctrl-C on the GPU path, as a user sends it: `slide train` of llama-3.2-1b with its defaults and
`--out`, SIGINT once after step 10 (finish the step, save, exit 130; the checkpoint loads in
transformers and `--resume` runs it to the end), then twice 0.2 s apart (abort, exit 130). The
CPU tests check the same rules bit for bit; this checks them where the lanes are CUDA streams.

    python3 bench/device/ctrl_c_trials.py TOKENS.npy OUT_DIR
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

STEPS = 40
MODEL = "llama-3.2-1b"


def _train(tokens: str, out: Path, metrics: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "slide.cli", "train", "--model", MODEL, "--data", tokens,
           "--batch", "16", "--seq", "1024", "--steps", str(STEPS), "--no-progress",
           "--out", str(out), "--metrics", str(metrics), *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _steps_logged(metrics: Path) -> int:
    return sum(1 for _ in metrics.open()) if metrics.exists() else 0


def _interrupt_after(proc: subprocess.Popen[str], metrics: Path, step: int, signals: int) -> float:
    """SIGINT `signals` times once `step` steps are logged; the seconds from it to the exit."""
    while _steps_logged(metrics) < step and proc.poll() is None:
        time.sleep(0.05)
    sent = time.perf_counter()
    for _ in range(signals):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
    proc.wait(timeout=180)
    return time.perf_counter() - sent


def _report(name: str, proc: subprocess.Popen[str], exit_s: float) -> str:
    stdout, stderr = proc.communicate()
    tail = [line for line in stderr.splitlines() if line.strip()][-2:]
    print(f"{name}: exit {proc.returncode} after {exit_s:.1f} s; stderr: {tail}")
    return stdout


def _load_in_transformers(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from slide.checkpoints import find_checkpoint

    ckpt = find_checkpoint(out)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.bfloat16).cuda()
    ids = torch.randint(0, 128000, (1, 64), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss.item()
    state = json.loads((ckpt / "slide_state.json").read_text())
    print(
        f"  checkpoint {ckpt.name}: steps_done {state['steps_done']}, transformers loss {loss:.3f}"
    )


def main(tokens: str, out_dir: str) -> None:
    runs = Path("/tmp/ctrl-c")
    once, metrics = runs / "once", Path(out_dir) / "ctrl-c-once.jsonl"
    proc = _train(tokens, once, metrics)
    summary = _report("SIGINT once after step 10", proc, _interrupt_after(proc, metrics, 10, 1))
    if summary.strip():
        s = json.loads(summary)
        print(f"  summary: steps_done {s['steps_done']}, interrupted {s['interrupted']}")
    _load_in_transformers(once)
    resumed = _train(tokens, once, Path(out_dir) / "ctrl-c-resumed.jsonl", "--resume", str(once))
    start = time.perf_counter()
    resumed.wait(timeout=300)
    stdout = _report("--resume to the end", resumed, time.perf_counter() - start)
    if stdout.strip():
        print(f"  resumed: steps_done {json.loads(stdout)['steps_done']}")

    twice, metrics = runs / "twice", Path(out_dir) / "ctrl-c-twice.jsonl"
    proc = _train(tokens, twice, metrics)
    _report("SIGINT twice after step 10", proc, _interrupt_after(proc, metrics, 10, 2))
    print(f"  steps logged: {_steps_logged(metrics)}; published: {(twice / 'latest').exists()}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
