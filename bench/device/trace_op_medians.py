"""Median and per-step sum of each (lane, kind) of ops in measured traces (Slide's format), beside
the dispatch floors of a machine profile when one is given: where small ops' time goes.

    python3 bench/device/trace_op_medians.py [--machine PROFILE.toml] TRACE.json ...
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--machine", type=Path)
    parser.add_argument("traces", nargs="+", type=Path)
    args = parser.parse_args()
    if args.machine:
        from slide_ir.specs.hardware import load_machine_toml

        gpu = load_machine_toml(args.machine.read_text()).gpu
        print(f"profile floors (ms): fwd {_ms(gpu.layer_fwd_floor_s)}, bwd "
              f"{_ms(gpu.layer_bwd_floor_s)}, loss {_ms(gpu.loss_floor_s)}")  # fmt: skip
    for path in args.traces:
        spans = json.loads(path.read_text())["spans"]
        steps = {s["step"] for s in spans}
        by_kind: dict[tuple[str, str], list[float]] = defaultdict(list)
        for s in spans:
            by_kind[(s["lane"], s["kind"])].append(s["end"] - s["start"])
        print(f"{path.name}: {len(spans)} spans over steps {min(steps)}-{max(steps)}")
        for (lane, kind), seconds in sorted(by_kind.items()):
            print(f"  {lane:5s} {kind:10s} n={len(seconds):4d} median {_ms(statistics.median(seconds))}"
                  f" ms, per step {_ms(sum(seconds) / len(steps))} ms")  # fmt: skip


def _ms(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds * 1e3:.3f}"


if __name__ == "__main__":
    main()
