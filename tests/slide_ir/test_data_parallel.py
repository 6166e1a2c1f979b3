"""Data-parallel sliding on one node (`slide_ir.planning.data_parallel`): rank r's graph from the
single-GPU plan, its collectives, shards and per-rank / per-host ledger, and their pricing."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from slide_ir.ir.graph import Graph, OpKind, UnitPlacement
from slide_ir.ir.shards import shard_range, shard_size
from slide_ir.planning.cost import RING_STEP_S, CostModel, ring_seconds
from slide_ir.planning.data_parallel import check_nproc, plan_data_parallel, shard_plan
from slide_ir.planning.planner import plan
from slide_ir.planning.programs import GRAPH_STEPS
from slide_ir.planning.units import unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine, load_machine_toml, machine_to_toml
from slide_ir.specs.model_catalog import load_model

K = OpKind


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def h200():
    return load_machine("h200-16c-128g")


def _config(**kw) -> TrainConfig:
    return TrainConfig(**{"batch": 4, "seq": 64, "steps": 2, **kw})


# -- shards ------------------------------------------------------------------------------------
@pytest.mark.parametrize("elements", [1, 2, 7, 41, 4097, 1_000_003])
@pytest.mark.parametrize("nproc", [1, 2, 3, 4, 7, 8])
def test_shard_ranges_tile_the_unit_exactly(elements, nproc):
    ranges = [shard_range(elements, nproc, r) for r in range(nproc)]
    assert ranges[0][0] == 0 and ranges[-1][1] == elements
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end == start  # contiguous, no gap, no overlap
    sizes = [b - a for a, b in ranges]
    assert sum(sizes) == elements
    assert max(sizes) == sizes[0] == shard_size(elements, nproc)  # rank 0: the padded part
    assert all(s >= 0 for s in sizes)


def test_shard_range_refuses_a_rank_outside_the_group():
    with pytest.raises(ValueError, match="rank"):
        shard_range(10, 2, 2)


# -- the ring formulas -------------------------------------------------------------------------
def test_ring_formulas():
    b, bw = 8_000_000, 100e9
    assert ring_seconds(K.REDUCE_SCATTER, b, 1, bw) == 0.0
    for n in (2, 4, 8):
        one_pass = (n - 1) * RING_STEP_S + (n - 1) / n * b / bw
        assert ring_seconds(K.REDUCE_SCATTER, b, n, bw) == pytest.approx(one_pass)
        assert ring_seconds(K.ALL_GATHER, b, n, bw) == pytest.approx(one_pass)
        assert ring_seconds(K.ALL_REDUCE, b, n, bw) == pytest.approx(2 * one_pass)


def test_collectives_priced_over_nvlink_or_pcie_peer_to_peer(h200, pc, tiny):
    dp = plan_data_parallel(tiny, h200, _config(), 4)
    rs = next(op for op in dp.graph.ops if op.kind == K.REDUCE_SCATTER)
    launch = CostModel(h200).efficiency.launch_s
    want = ring_seconds(K.REDUCE_SCATTER, rs.work.bytes, 4, 370e9)
    assert CostModel(h200, nproc=4).seconds(rs) == pytest.approx(launch + want)
    assert h200.peer_bytes_per_s == 370e9  # the H200 part's NVLink, as NCCL reaches it
    assert pc.gpu.nvlink_bytes_per_s is None  # an RTX 4090: peers over PCIe
    assert pc.peer_bytes_per_s == pc.link.duplex_bytes_per_s
    with pytest.raises(ValueError, match="cluster"):  # a single-GPU model has no ring
        CostModel(h200).seconds(rs)


def test_the_host_is_shared_by_the_ranks(h200, tiny):
    """Each rank's host AdamW does 1/N of the elements at 1/N of the host's rate."""
    one = plan(tiny, h200, _config(placement="small"))
    adam = next(op for op in one.graph.ops if op.kind == K.ADAM)
    whole, launch = CostModel(h200).seconds(adam), CostModel(h200).efficiency.launch_s
    for n in (2, 4):
        w = adam.work
        shard = replace(adam, work=replace(w, elements=w.elements // n, bytes=w.bytes // n))
        assert CostModel(h200, nproc=n).seconds(shard) - launch == pytest.approx(
            (whole - launch) * (w.elements // n) * n / w.elements
        )


def test_machine_profiles_round_trip_with_the_interconnect(h200):
    assert load_machine_toml(machine_to_toml(h200)) == h200
    assert "nvlink_gb_per_s" in machine_to_toml(h200)


# -- the graph ---------------------------------------------------------------------------------
def test_one_rank_is_the_single_gpu_plan(h200, tiny):
    config = _config()
    dp = plan_data_parallel(tiny, h200, config, 1)
    assert dp.graph == plan(tiny, h200, config).graph
    assert not any(op.lane == "net" for op in dp.graph.ops)
    assert dp.rank_bytes("gpu") == dp.base.ledger.peak_bytes("gpu")
    assert dp.host_bytes("cpu") == dp.base.ledger.peak_bytes("cpu")


@pytest.mark.parametrize("placement", ["small", "fast"])
@pytest.mark.parametrize("nproc", [2, 3])
def test_every_unit_is_reduce_scattered_and_all_gathered(h200, tiny, placement, nproc):
    config = _config(batch=6, placement=placement, grad_accum=2)
    dp = plan_data_parallel(tiny, h200, config, nproc)
    Graph.from_json(dp.graph.to_json())  # validates again, dataflow included
    assert dp.base.config.batch == 6 // nproc
    n_units = tiny.num_layers + 2
    for step in range(1, config.steps + 1):
        ops = [op for op in dp.graph.ops if op.step == step]
        scattered = {op.unit for op in ops if op.kind == K.REDUCE_SCATTER}
        gathered = {op.unit for op in ops if op.kind == K.ALL_GATHER}
        assert scattered == gathered == set(range(n_units))
    for op in dp.graph.ops:
        if op.lane == "net":
            q = unit_params(tiny, op.unit)
            assert op.work.bytes == nproc * shard_size(q, nproc) * 2  # N padded BF16 shards


def test_transfers_and_updates_move_the_ranks_shard(h200, tiny):
    config = _config(placement="small")
    single = plan(tiny, h200, replace(config, batch=2))
    dp = shard_plan(single, 2)
    before = {op.id: op for op in single.graph.ops}
    for op in dp.graph.ops:
        if op.kind in (K.H2D_PARAM, K.D2H_GRAD, K.ADAM):
            q = unit_params(tiny, op.unit)
            shard = shard_size(q, 2)
            assert op.work.bytes == -(-before[op.id].work.bytes * shard // q)
            assert op.work.elements == -(-before[op.id].work.elements * shard // q)
        elif op.lane != "net":
            assert op.work == before[op.id].work  # compute is the rank's batch already


def test_collectives_sit_between_compute_and_transfers(h200, tiny):
    dp = plan_data_parallel(tiny, h200, _config(placement="small"), 2)
    ops = {op.id: op for op in dp.graph.ops}
    for op in dp.graph.ops:
        if op.kind == K.D2H_GRAD:
            (rs,) = [ops[d] for d in op.deps if ops[d].kind == K.REDUCE_SCATTER]
            assert rs.unit == op.unit
        if op.kind in (K.FWD, K.BWD, K.RECOMPUTE) and 1 <= op.unit <= tiny.num_layers:
            waits = [ops[d].kind for d in op.deps]
            assert K.H2D_PARAM not in waits  # it waits for the all-gather instead


def test_resident_units_update_their_shard_on_the_gpu(h200, tiny):
    dp = plan_data_parallel(tiny, h200, _config(placement="fast", resident=2), 2)
    resident = [u for u, p in enumerate(dp.graph.info.placement) if p == UnitPlacement.RESIDENT]
    assert resident
    u = resident[0]
    ops = [op for op in dp.graph.ops if op.unit == u and op.step == 1]
    kinds = [op.kind for op in ops if op.kind in (K.REDUCE_SCATTER, K.GPU_ADAM, K.ALL_GATHER)]
    assert kinds == [K.REDUCE_SCATTER, K.GPU_ADAM, K.ALL_GATHER]
    adam = next(op for op in ops if op.kind == K.GPU_ADAM)
    assert adam.work.elements == shard_size(unit_params(tiny, u), 2)


# -- the ledger --------------------------------------------------------------------------------
def test_host_ram_does_not_grow_with_the_ranks(h200):
    model = load_model("llama-3.1-8b")
    config = TrainConfig(batch=32, seq=1024, placement="small")
    host = {}
    for n in (1, 2, 4, 8):
        dp = plan_data_parallel(model, h200, config, n)
        state = sum(t.bytes for t in dp.terms if t.label in ("fp32 master weights", "Adam moments"))
        host[n] = dp.host_bytes("cpu")
        # master + moments: 12 B/param across the ranks (padding aside), not 12 N
        assert n * state == pytest.approx(12 * model.total_params, rel=1e-3)
        assert dp.rank_bytes("gpu") <= dp.base.ledger.peak_bytes("gpu")
    # each rank's process runtime is the per-rank growth, and its step losses' host copies
    runtime = 2 * 2**30 + 4 * GRAPH_STEPS
    for n in (2, 4, 8):
        assert host[n] <= host[1] + (n - 1) * runtime


def test_resident_state_is_sharded_on_each_gpu(h200, tiny):
    dp = plan_data_parallel(tiny, h200, _config(placement="fast", resident=2), 2)
    (term,) = [t for t in dp.terms if t.name.startswith("gpu_resident_layers")]
    q, k = unit_params(tiny, 1), dp.graph.pool(term.name).slots
    assert term.single == k * q * 16
    assert term.bytes == k * (q * 4 + shard_size(q, 2) * 12)


# -- inputs ------------------------------------------------------------------------------------
def test_nproc_and_batch_are_checked(h200):
    config = TrainConfig(batch=32, seq=128)
    for bad in (0, -1, 9):
        with pytest.raises(ValueError, match="from 1 to 8"):
            check_nproc(h200, config, bad)
    eight = replace(h200, gpus=8)
    with pytest.raises(ValueError, match="the machine has 8 GPUs"):
        check_nproc(eight, config, 9)
    with pytest.raises(ValueError, match="multiple of 3"):
        check_nproc(h200, config, 3)
    with pytest.raises(ValueError, match="sliding"):
        check_nproc(h200, replace(config, schedule="gpu-only"), 2)
    check_nproc(h200, config, 8)


def test_streamed_units_update_their_shard_and_send_it_down(h200, tiny):
    single = plan(tiny, h200, _config(batch=2, streamed=2, resident=0))
    dp = shard_plan(single, 2)
    before = {op.id: op for op in single.graph.ops}
    (u, *_) = single.ledger.streamed
    q, shard = unit_params(tiny, u), shard_size(unit_params(tiny, u), 2)
    ops = [op for op in dp.graph.ops if op.unit == u and op.step == 2]
    kinds = [op.kind for op in ops if op.lane in ("net", "gpu") or op.kind == K.W_D2H]
    assert kinds.index(K.REDUCE_SCATTER) < kinds.index(K.GPU_ADAM) < kinds.index(K.W_D2H)
    for op in ops:
        if op.kind in (K.GPU_ADAM, K.W_D2H, K.OPT_H2D, K.OPT_D2H):
            assert op.work.bytes == -(-before[op.id].work.bytes * shard // q)
