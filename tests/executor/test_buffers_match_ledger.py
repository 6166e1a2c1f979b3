"""What the executor allocates is what the ledger plans: every allocated pool, byte for byte, at
BF16 compute (the ledger's unit). Pools the allocator leaves to torch (context, workspace, host
runtime) and NVMe regions (files) are not host or device buffers and are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_models import spec_of
from runs import build_run, model_config

from executor.buffers import NOT_ALLOCATED
from slide_ir import TrainConfig, load_machine
from slide_ir.ir.graph import Tier
from slide_ir.planning.planner import plan

CASES = {
    "sliding": {},
    "streamed-3": {"streamed": 3},
    "streamed-3-global-clipping": {"streamed": 3, "clip": "global", "speculate": 0},
    "resident-2-streamed-2-bf16-moments": {"resident": 2, "streamed": 2, "moments_dtype": "bf16"},
    "grad-accum-2": {"grad_accum": 2, "streamed": 0},
    "nvme-moments": {"optimizer": "nvme-moments", "streamed": 0},
    "nvme-cast": {"optimizer": "nvme", "streamed": 0, "host_weights": "cast"},
    "zero-offload": {"schedule": "zero-offload"},
    "lean-nvme-cast": {"optimizer": "nvme", "streamed": 0, "host_weights": "cast",
                       "lean_buffers": True},
    "lean-nvme-moments-held": {"optimizer": "nvme-moments", "streamed": 0, "clip": "global",
                               "held_grads": "nvme", "lean_buffers": True},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_allocated_bytes_equal_the_ledger_pools(case: str, tmp_path: Path) -> None:
    cfg = model_config(tied=case.startswith("streamed"))
    machine = load_machine("h200-16c-128g", nvme=1)
    config = {"placement": "small", **CASES[case]}  # the case's placement, not a searched one
    p = plan(spec_of(cfg), machine, TrainConfig(batch=2, seq=16, steps=1, **config))
    run = build_run(p, cfg, tmp_path, torch.bfloat16)
    allocated = run.env.buffers.allocated
    checked = 0
    for pool in p.graph.pools:
        if pool.tier == Tier.NVME or pool.name not in allocated:
            assert pool.role in NOT_ALLOCATED, pool.name
            continue
        assert allocated[pool.name] == pool.bytes, pool.name
        checked += 1
    assert checked >= 6
    run.close()
