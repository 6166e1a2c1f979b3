"""The prediction grid replayed: each measured run's placement planned again on the profile it
ran with, and predicted by the cost model of this tree (no GPU: the measurements stay those of
the jsonl lines). For a change to the cost model between device calls.

    python -m bench.speed.shape_grid_replay [--lce-bytes 14]   (14: the model the runs predicted with)
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import slide_ir.planning.cost as cost_module
import slide_ir.specs.model as model_module
from slide_ir.planning.cost import CostModel
from slide_ir.planning.planner import plan
from slide_ir.planning.timeline import predict_step_s
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model

DATA = Path(__file__).parents[1] / "data" / "shape-grid"
# the profile each group ran with: call 2's (grid-a, after the cold run's re-fit), call 3's
# (grid-b, measured by its first run), the preset
PROFILES = {"grid-a": DATA / "profile-call2.toml", "grid-b": DATA / "profile-call3.toml",
            "preset": "h200-16c-128g"}  # fmt: skip
_PLACED = re.compile(r"(\d+) resident, (\d+) streamed, \d+ sliding units; inputs on (\w+), "
                     r"(\d+) cache units; (\d+) kept tapes")  # fmt: skip


def pinned(model: str, batch: int, seq: int, placement: str) -> TrainConfig:
    found = _PLACED.match(placement)
    if found is None:
        raise ValueError(f"cannot read the placement {placement!r}")
    resident, streamed, inputs, cache, kept = found.groups()
    return TrainConfig(batch=batch, seq=seq, resident=int(resident), streamed=int(streamed),
                       activations=inputs, cache_units=int(cache), keep_activations=int(kept))  # fmt: skip


def replay(group: str) -> list[tuple[str, float, float, float]]:
    machine = load_machine(str(PROFILES[group]))
    rows = []
    for line in (DATA / f"{group}.jsonl").read_text().splitlines():
        run = json.loads(line)
        model, batch, seq = run["point"][:3]
        s = run["summary"]
        config = pinned(model, batch, seq, s["placement"])
        step = predict_step_s(plan(load_model(model), machine, config).graph, CostModel(machine))
        was = batch * seq / s["predicted_tokens_per_s"]
        measured = batch * seq / s["tokens_per_s"]
        rows.append((f"{group} {model} b{batch} s{seq}", was, step, measured))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lce-bytes", type=int, default=model_module.LCE_BYTES_PER_LOGIT)
    a = ap.parse_args()
    model_module.LCE_BYTES_PER_LOGIT = cost_module.LCE_BYTES_PER_LOGIT = a.lce_bytes
    print("| point | predicted then (s/step) | replayed | measured | error then | error now |")
    print("|---|---|---|---|---|---|")
    for group in PROFILES:
        for name, was, now, measured in replay(group):
            print(f"| {name} | {was:.4f} | {now:.4f} | {measured:.4f} | "
                  f"{measured / was - 1:+.1%} | {measured / now - 1:+.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
