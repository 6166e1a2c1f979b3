"""The host's copy buffers one deep (`lean_buffers`: one landing slot and one cast slot shared by
every host-updated unit, one NVMe staging slot per drive and group with no read-ahead, one for
the layer inputs on NVMe) train bit
for bit as the default rings, and as the plain PyTorch loop within its tolerance; the graph
holds those pools, one slot each."""

from __future__ import annotations

import pytest
import test_global_clip
from runs import assert_bitwise_equal, assert_matches_reference, graph_of, run_executor

from slide_ir.ir.graph import PoolRole as R

CASES = {
    "sliding": (False, 0, {}),
    "tied-cast": (True, 0, {"host_weights": "cast"}),
    "grad-accum-2": (False, 0, {"grad_accum": 2, "host_weights": "cast"}),
    "nvme-moments": (False, 1, {"optimizer": "nvme-moments", "host_weights": "cast"}),
    "nvme-2-drives": (False, 2, {"optimizer": "nvme", "host_weights": "cast"}),
    "inputs-on-nvme": (True, 1, {"activations": "nvme", "optimizer": "nvme-moments",
                                 "host_weights": "cast"}),
    "held-on-nvme": (False, 1, {**test_global_clip.CLIP, "optimizer": "nvme-moments",
                                "held_grads": "nvme", "host_weights": "cast"}),
}  # fmt: skip
ONE_DEEP = (R.GRAD_LANDING, R.WEIGHT_STAGING)


@pytest.mark.parametrize("case", sorted(CASES))
def test_lean_buffers_train_bitwise_as_the_default_rings(case: str) -> None:
    tied, drives, config = CASES[case]
    graph = graph_of(tied, drives=drives, lean_buffers=True, **config)
    pools = {p.role: p for p in graph.pools if p.role in ONE_DEEP}
    cast = config.get("host_weights") == "cast"  # else the uploads read a pinned copy: no ring
    assert set(pools) == ({*ONE_DEEP} if cast else {R.GRAD_LANDING})
    assert all(p.slots == 1 for p in pools.values())
    assert pools[R.GRAD_LANDING].units == tuple(range(6))  # every unit, the (tied) head too
    staging = [p for p in graph.pools if p.role in (R.OPT_STAGING, R.MASTER_STAGING)]
    assert all(p.slots == max(drives, 1) for p in staging) and bool(staging) == bool(drives)
    if config.get("activations") == "nvme":
        (inputs,) = [p for p in graph.pools if p.name == "pinned_act_staging"]
        assert inputs.slots == 1
    lean = run_executor(tied, drives=drives, lean_buffers=True, **config)
    assert_matches_reference(lean, tied, config)
    assert_bitwise_equal(lean, run_executor(tied, drives=drives, **config))
