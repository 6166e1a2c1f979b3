"""The disk's sustained write bandwidth as a checkpoint meets it: N GiB written in 64 MiB
buffered writes, then fsync, timed together (what `write_safetensors` does), printed as JSON."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

CHUNK = 64 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/tmp", help="directory on the disk to measure")
    parser.add_argument("--gib", type=float, default=8.0, help="GiB to write")
    args = parser.parse_args()
    path = Path(args.dir) / f".slide-disk-write-{os.getpid()}"
    block = os.urandom(CHUNK)
    total = int(args.gib * (1 << 30)) // CHUNK * CHUNK
    try:
        start = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(total // CHUNK):
                f.write(block)
            written = time.perf_counter()
            f.flush()
            os.fsync(f.fileno())
        end = time.perf_counter()
    finally:
        path.unlink(missing_ok=True)
    print(json.dumps({"dir": args.dir, "bytes": total, "write_s": written - start,
                      "write_and_fsync_s": end - start,
                      "gb_per_s": total / (end - start) / 1e9}))  # fmt: skip


if __name__ == "__main__":
    main()
