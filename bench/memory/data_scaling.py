"""Does host memory stay flat in the data set's size? A JSONL of `--big-mb` against one of
`--small-mb` (the same rows, repeated): `slide data` preparing each token cache (wall time, peak
RSS), `slide data` again (the cache found: hashing the file only), then `slide train` on each
(tiny-llama on the CPU, the built-in tiny tokenizer, shuffled windows over the whole file;
peak RSS). Each command is its own process; peak RSS is its ru_maxrss.

    python -m bench.memory.data_scaling --dir /tmp/slide-data-bench   # ~2.5 GB of disk
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from slide.tokenizer import CORPUS, build_tiny_tokenizer

TRAIN = ["--model", "tiny-llama", "--device", "cpu", "--steps", "20", "--batch", "4",
         "--seq", "128", "--no-progress"]  # fmt: skip


def write_jsonl(path: Path, megabytes: int) -> Path:
    """Rows of corpus words, one in three a prompt/completion pair (so the mask is stored)."""
    if path.is_file():
        return path
    rng = random.Random(0)
    words = CORPUS.read_text(encoding="utf-8").split()
    rows = []
    for i in range(8000):
        text = " ".join(rng.choices(words, k=rng.randint(20, 120)))
        rows.append({"prompt": text[:60], "completion": text[60:]} if i % 3 == 0 else
                    {"text": text})  # fmt: skip
    block = "".join(json.dumps(r) + "\n" for r in rows)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for _ in range(megabytes * 2**20 // len(block) + 1):
            f.write(block)
    tmp.rename(path)
    return path


def run(argv: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of `python -m slide ARGV`."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "slide", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"slide {' '.join(argv)} failed")
    return time.perf_counter() - start, usage.ru_maxrss * 1024, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=Path("/tmp/slide-data-bench"))
    parser.add_argument("--big-mb", type=int, default=1024)
    parser.add_argument("--small-mb", type=int, default=10)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(args.dir / "tokenizer")
    cache = args.dir / "cache"
    shutil.rmtree(cache, ignore_errors=True)  # this script's own: each run prepares afresh
    print("| data | size | prepare s | prepare peak RSS | tokens | again s | train peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for name, megabytes in (("small", args.small_mb), ("big", args.big_mb)):
        path = write_jsonl(args.dir / f"{name}-{megabytes}mb.jsonl", megabytes)
        data = ["--data", str(path), "--tokenizer", str(tokenizer),
                "--data-cache", str(cache)]  # fmt: skip
        prep_s, prep_rss, out = run(["data", *data, "--no-progress"])
        again_s, _, _ = run(["data", *data, "--no-progress"])
        _, train_rss, _ = run(["train", *TRAIN, *data])
        tokens = out.split()[1]
        print(f"| {path.name} | {path.stat().st_size / 2**20:,.0f} MiB | {prep_s:.1f} | "
              f"{prep_rss / 2**20:,.0f} MiB | {tokens} | {again_s:.1f} | "
              f"{train_rss / 2**20:,.0f} MiB |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
