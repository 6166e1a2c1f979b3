"""Gradient landing in the ledger and the graph: the host-updated embedding and head share one
pinned slot (their gradients come down at the two ends of the backward), except under deferred
updates, where every gradient waits for the norm in a buffer of its own; host bytes per
parameter of the smallest footprint against a hand count of every host term."""

from __future__ import annotations

import networkx as nx
import pytest

from slide_ir.ir.graph import OpKind, PoolRole
from slide_ir.planning.ledger import build_ledger
from slide_ir.planning.placement import smallest_ledger
from slide_ir.planning.planner import build_graph
from slide_ir.planning.units import GIB, unit_params
from slide_ir.program import MAX_PASS_STEPS
from slide_ir.specs.config import TrainConfig

R = PoolRole


def _config(**kw: object) -> TrainConfig:
    return TrainConfig(batch=1, seq=1024, activations="cpu", **kw)  # type: ignore[arg-type]


def _landing(led) -> dict[str, tuple[int, int, tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    return {t.pool.name: (t.pool.slots, t.pool.slot_bytes, t.pool.units)
            for t in led.terms if t.pool.role == R.GRAD_LANDING}  # fmt: skip


def test_embedding_and_head_share_one_landing_slot(llama8b, pc) -> None:
    n = llama8b.num_layers
    head, embed, layer = (unit_params(llama8b, u) for u in (n + 1, 0, 1))
    assert head == embed + llama8b.hidden_size  # untied: the head adds the final norm
    got = _landing(build_ledger(llama8b, pc, _config(host_weights="cast")))
    assert got == {"pinned_grads_vocab": (1, 2 * head, (0, n + 1)),
                   "pinned_grads_layers": (3, 2 * layer, tuple(range(1, n + 1)))}  # fmt: skip


def test_deferred_updates_keep_a_landing_slot_per_unit(llama8b, pc) -> None:
    n = llama8b.num_layers
    got = _landing(build_ledger(llama8b, pc, _config(clip="global")))
    assert got["pinned_grads_embed"] == (1, 2 * unit_params(llama8b, 0), (0,))
    assert got["pinned_grads_head"] == (1, 2 * unit_params(llama8b, n + 1), (n + 1,))
    assert got["pinned_grads_layers"][0] == n
    assert "pinned_grads_vocab" not in got


def test_a_resident_embedding_leaves_the_head_its_own_slot(llama8b, pc) -> None:
    n = llama8b.num_layers
    got = _landing(build_ledger(llama8b, pc, _config(), resident=(0,)))
    assert got["pinned_grads_head"] == (1, 2 * unit_params(llama8b, n + 1), (n + 1,))
    assert "pinned_grads_vocab" not in got and "pinned_grads_embed" not in got


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_the_embedding_lands_after_the_head_frees_the_slot(llama8b, pc, grad_accum) -> None:
    """Every tenant of the shared slot acquires it after the previous one's release, on a
    dependency path (the graph's reuse check), in the order head, embedding per micro-batch."""
    config = _config(host_weights="cast", grad_accum=grad_accum, steps=2)
    led = build_ledger(llama8b, pc, config)
    graph = build_graph(llama8b, pc, config, led)  # checked: slot reuse ordered, no races
    n = llama8b.num_layers
    downs = [op for op in graph.ops if op.kind == OpKind.D2H_GRAD and op.unit in (0, n + 1)]
    assert [op.unit for op in downs] == [n + 1, 0] * 2 * grad_accum
    assert {s for op in downs for s in op.acquires} == {"pinned_grads_vocab.0"}
    # each tenant's last reader (its update, or its accumulation) frees the slot, and the
    # next tenant's download depends on that release
    freeing = [op for op in graph.ops if "pinned_grads_vocab.0" in op.releases]
    assert [op.unit for op in freeing] == [op.unit for op in downs]
    assert {op.kind for op in freeing} <= {OpKind.ADAM, OpKind.GRAD_ACCUM}
    dag = graph.to_networkx()
    for freed, nxt in zip(freeing, downs[1:], strict=False):
        assert nx.has_path(dag, freed.id, nxt.id), (freed.id, nxt.id)


def test_host_bytes_of_the_smallest_footprint_are_the_hand_count(llama8b, pc) -> None:
    """CPU AdamW, FP32 moments, uploads cast: 12 B/param of state, then the landing (3 layer
    slots and one vocab slot), the weight ring (2 slots of the largest unit), the saved layer
    inputs at batch 1 and the 2 GiB process runtime, all at 2 B per element; the data path's
    staged micro-batches (two steps' ids and labels, int64) and step losses (FP32). The smallest
    footprint a fit is judged by has the copy buffers one deep: one landing slot and one ring
    slot, each the largest unit (SlideFormer's one gradient and one convert buffer)."""
    n, h = llama8b.num_layers, llama8b.hidden_size
    head, layer = unit_params(llama8b, n + 1), unit_params(llama8b, 1)
    small = build_ledger(llama8b, pc, _config(host_weights="cast", placement="small"))
    data = 2 * 2 * 1024 * 8 + 4 * MAX_PASS_STEPS
    rest = 12 * llama8b.total_params + n * 1024 * h * 2 + 2 * GIB + data
    hand = rest + 2 * (3 * layer + head) + 2 * 2 * head
    assert small.peak_bytes("cpu") == hand
    assert 12.85 < hand / llama8b.total_params < 12.86
    lean = smallest_ledger(llama8b, pc, _config(host_weights="cast"))
    assert lean.peak_bytes("cpu") == rest + 2 * head + 2 * head
    assert 12.56 < lean.peak_bytes("cpu") / llama8b.total_params < 12.57
