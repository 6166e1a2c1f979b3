"""The 2,000-step tiny-llama soak, run in a process of its own as `slide train` runs: a pytest
process that has run hundreds of tests carries a fragmented heap whose growth is not the
executor's. Prints its measurements as JSON for tests/executor/test_long_runs.py."""

from __future__ import annotations

import gc
import json
import os
import threading

import torch

from executor.completion import Completion
from executor.env import MicroBatch
from slide.session import train
from slide.weights import RandomInit
from slide_ir import TrainConfig, load_machine
from slide_ir.ir.trace import MemorySample, Span
from slide_ir.specs.model_catalog import load_model

STEPS = 2000
WARM = 200
OWNED = {Span, Completion, MicroBatch, MemorySample}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _objects() -> tuple[int, int]:
    """(the executor's per-op and per-step objects, every object the collector tracks). No
    collection first: a full one empties CPython's tuple free lists, which the run fills when
    its steady state begins (executor/free_lists.py), and their refill would then be RSS
    growth of the soak's making. The list of every object (~2 MB) is a glibc mmap whose free
    raises glibc's mmap threshold, so that later allocations of that size come from the heap,
    which grows once (1.3 MB on tiny-llama): the count is no part of the run's growth."""
    everything = gc.get_objects()
    return sum(type(o) in OWNED for o in everything), len(everything)


def main() -> None:
    spec = load_model("tiny-llama")
    seen = {}

    def on_step(step, loss, lr, metrics):
        if step in (WARM, STEPS):
            # RSS after the count at warm-up and before it at the end: see _objects
            rss = _rss() if step == STEPS else None
            own, every = _objects()
            seen[step] = {"rss": rss or _rss(), "owned": own, "objects": every,
                          "threads": threading.active_count()}  # fmt: skip

    def data():
        g = torch.Generator().manual_seed(0)
        while True:
            ids = torch.randint(0, spec.vocab_size, (1, 16), generator=g)
            yield ids, ids

    result = train(
        spec,
        load_machine("h200-16c-128g"),
        TrainConfig(batch=1, seq=16, steps=STEPS),
        initial_state=RandomInit(spec, 0),
        batches=data(),
        device="cpu",
        dtype=torch.float32,
        on_step=on_step,
    )
    print(json.dumps({"steps_done": result.steps_done, "warm": seen[WARM], "end": seen[STEPS],
                      "trace_steps": sorted({s.step for s in result.trace.spans})}))  # fmt: skip


if __name__ == "__main__":
    main()
