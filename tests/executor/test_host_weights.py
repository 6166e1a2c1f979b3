"""Uploads cast from the master into the weight ring (`--host-weights cast`) train bit for bit as
the pinned copy of every unit does (`pinned`), on every placement the CPU parity tests cover
(test_train_equivalence's and test_global_clip's cases); and the cast layout really is the one
run: its graph has the casts, no pinned copy for the units that cast, and updates that write
none."""

from __future__ import annotations

import pytest
import test_global_clip
import test_train_equivalence
from runs import assert_bitwise_equal, graph_of, run_executor

from slide_ir.ir.graph import OpKind, PoolRole, slot_pool

CASES = {
    **{name: (tied, 0, config) for name, (tied, config) in test_train_equivalence.CASES.items()},
    **{
        f"global-{name}": (tied, drives, {**test_global_clip.CLIP, **extra})
        for name, (tied, drives, extra) in test_global_clip.CASES.items()
    },
}


def _config(case: str) -> tuple[bool, dict]:
    tied, drives, config = CASES[case]
    return tied, {**config, "drives": config.get("drives", drives)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cast_trains_bitwise_as_the_pinned_copy(case: str) -> None:
    tied, config = _config(case)
    cast = run_executor(tied, host_weights="cast", **config)
    pinned = run_executor(tied, host_weights="pinned", **config)
    assert cast.losses == pinned.losses
    assert_bitwise_equal(cast, pinned)


@pytest.mark.parametrize("case", ["sliding-untied", "grad-accum-2", "global-sliding",
                                  "nvme-optimizer-2-drives", "global-nvme-state"])  # fmt: skip
def test_the_cast_graph_casts_and_keeps_no_copy(case: str) -> None:
    tied, config = _config(case)
    graph = graph_of(tied, host_weights="cast", **config)
    (ring,) = [p for p in graph.pools if p.role == PoolRole.WEIGHT_STAGING]
    copies = {u for p in graph.pools if p.role == PoolRole.HOST_WEIGHTS for u in p.units}
    assert ring.units and not copies & set(ring.units)
    uploads = [op for op in graph.ops if op.kind == OpKind.H2D_PARAM and op.unit in ring.units]
    for op in uploads:  # each reads the slot its cast wrote, and frees it
        (src,) = op.reads
        cast = graph.op(op.id.replace("h2d", "cast"))
        assert cast.kind == OpKind.CAST and cast.lane == "cpu" and cast.id in op.deps
        assert cast.writes[0] == src and src.slot in op.releases
    updates = [op for op in graph.ops if op.kind == OpKind.ADAM and op.unit in ring.units]
    assert updates and all(w.slot.rpartition(".")[0] not in {p.name for p in graph.pools
                                                              if p.role == PoolRole.HOST_WEIGHTS}
                           for op in updates for w in op.writes)  # fmt: skip


@pytest.mark.parametrize("case", ["nvme-optimizer-2-drives", "global-nvme-state"])
def test_a_master_on_nvme_is_read_from_each_drive_for_its_cast(case: str) -> None:
    """With the optimizer on NVMe a cast reads the master part of the unit's stripe on every
    drive into `master_staging`, after the unit's latest update, and frees those slots."""
    tied, config = _config(case)
    graph = graph_of(tied, host_weights="cast", **config)
    (staging,) = [p for p in graph.pools if p.role == PoolRole.MASTER_STAGING]
    casts = [op for op in graph.ops if op.kind == OpKind.CAST]
    assert casts and {op.unit for op in casts} == set(staging.units)
    drives = config["drives"]
    for cast in casts:
        reads = [graph.op(d) for d in cast.deps if graph.op(d).kind == OpKind.NVME_READ]
        assert len(cast.reads) == len(reads) == drives
        for k, (read, src) in enumerate(zip(reads, cast.reads, strict=True)):
            assert read.lane == f"nvme{k}" and read.unit == cast.unit
            assert read.writes[0] == src and src.slot in cast.releases
            assert graph.pool(slot_pool(read.reads[0].slot)).role == PoolRole.NVME_STATE
