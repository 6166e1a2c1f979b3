"""Planner: ledgers by closed formula, graphs that validate, schedules that differ as designed."""

from dataclasses import replace

import pytest

from slide_ir.ir.graph import OpKind, Tier
from slide_ir.ir.printing import format_graph, parse_graph
from slide_ir.planning.ledger import build_ledger
from slide_ir.planning.planner import plan, plan_from_json, plan_to_json
from slide_ir.planning.units import unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model

GB = 1e9


def test_sliding_cpu_ram_holds_master_and_moments(llama8b, pc):
    p = plan(llama8b, pc, TrainConfig(batch=16, seq=1024, placement="small"))
    n_all = llama8b.total_params
    breakdown = p.ledger.breakdown("cpu")
    assert breakdown["fp32 master weights"] == 4 * n_all
    assert breakdown["Adam moments"] == 8 * n_all
    assert p.ledger.peak_bytes("cpu") >= 12 * n_all
    assert p.ledger.breakdown("cpu")["bf16 weights (pinned)"] == 2 * n_all
    assert p.feasible


def test_pools_are_the_ledger(llama8b, pc):
    """What an engine reserves per tier (the pools) is exactly the ledger's peak."""
    p = plan(llama8b, pc, TrainConfig(batch=4, seq=512, steps=2))
    tiers = p.graph.tier_bytes()
    assert tiers[Tier.GPU] == p.ledger.peak_bytes("gpu")
    assert tiers[Tier.CPU] + tiers[Tier.PINNED] == p.ledger.peak_bytes("cpu")
    assert tiers[Tier.PINNED] == p.ledger.pinned_bytes()


def test_gpu_units_scale_with_cache_units(llama8b, pc):
    small = build_ledger(
        llama8b, pc, TrainConfig(batch=1, seq=128, cache_units=2, activations="cpu")
    )
    big = build_ledger(llama8b, pc, TrainConfig(batch=1, seq=128, cache_units=5, activations="cpu"))
    assert big.peak_bytes("gpu") - small.peak_bytes("gpu") == 3 * 4 * llama8b.layer_params


def test_sliding_graph_shape(llama8b, pc):
    n = llama8b.num_layers
    g = plan(llama8b, pc, TrainConfig(batch=2, seq=256, steps=2, placement="small")).graph
    kinds = [op.kind for op in g.ops]
    assert kinds.count(OpKind.ADAM) == 2 * (n + 2)  # every unit, every step
    assert kinds.count(OpKind.D2H_GRAD) == 2 * (n + 2)
    assert kinds.count(OpKind.RECOMPUTE) == 2 * n
    # the last cache_units-1 layers stay on the GPU into the backward: fewer uploads
    uploads = kinds.count(OpKind.H2D_PARAM)
    assert uploads == 2 * ((n + 2) + (n - 2))
    # step 2's upload of a layer waits for step 1's update of it
    assert "s1.L5.adam" in g.op("s2.L5.w.h2d").deps
    # layer j's gradients leave right after its backward; the update follows the download
    # (and, with 3 pinned landing buffers, waits until layer 10's update has freed one)
    assert g.op("s1.L7.g.d2h").deps == ("s1.L7.bwd", "s1.L10.adam")
    assert "s1.L7.g.d2h" in g.op("s1.L7.adam").deps


def test_zero_offload_updates_after_full_backward(llama8b, pc):
    g = plan(llama8b, pc, TrainConfig(batch=2, seq=256, steps=2, schedule="zero-offload")).graph
    assert "s1.L0.g.d2h" in g.op("s1.L33.adam").deps  # after the last bucket's download
    assert "s1.L0.cast" in g.op("s1.L5.w.h2d").deps  # after the last cast
    assert "s1.L5.w.h2d" in g.op("s2.L5.fwd").deps


def test_gpu_only_holds_16_bytes_per_param(llama8b, pc):
    led = plan(llama8b, pc, TrainConfig(batch=1, seq=128, schedule="gpu-only")).ledger
    assert led.breakdown("gpu")["weights, grads, master, moments"] == 16 * llama8b.total_params
    assert not led.feasible and led.overflows()[0][0] == "gpu"


@pytest.mark.parametrize(
    "overrides",
    [
        {"activations": "gpu"},
        {"activations": "nvme", "optimizer": "nvme"},
        {"optimizer": "nvme-moments", "moments_dtype": "bf16"},
        {"grad_accum": 2},
        {"resident": 3},
        {"resident": 1, "streamed": 4, "moments_dtype": "bf16"},
        {"cache_units": 2, "act_buffers": 4},
        {"schedule": "zero-offload", "activations": "nvme"},
        {"schedule": "gpu-only", "activations": "gpu"},
    ],
)
def test_variants_build_valid_graphs(overrides):
    model = load_model("llama-3.2-1b")  # tied embeddings
    machine = load_machine("paper-pc-4090", nvme=2)
    p = plan(model, machine, TrainConfig(batch=2, seq=128, steps=2, **overrides))
    assert p.graph.ops  # validated on construction
    assert parse_graph(format_graph(p.graph)) == p.graph


def test_nvme_optimizer_stripes_over_drives():
    model = load_model("qwen2.5-0.5b")
    machine = load_machine("paper-pc-4090", nvme=2)
    config = TrainConfig(batch=1, seq=64, steps=1, optimizer="nvme", resident=0)
    p = plan(model, machine, config)
    lanes = p.graph.ops_per_lane()
    assert lanes["nvme0"] == lanes["nvme1"] > 0
    read = p.graph.op("s1.L3.opt.read1")
    assert read.work.bytes == -(-model.layer_params * 12 // 2)
    assert p.ledger.breakdown("nvme")["optimizer state (NVMe)"] == 12 * model.total_params


def test_nvme_without_drives_is_refused(llama8b):
    machine = load_machine("paper-pc-4090", nvme=0)
    with pytest.raises(ValueError, match="need at least one NVMe drive"):
        plan(llama8b, machine, TrainConfig(batch=1, seq=64, optimizer="nvme"))


def test_resident_units_update_on_the_gpu_and_the_rest_on_the_host():
    model, h200 = load_model("qwen2.5-14b"), load_machine("h200-16c-128g", ram_gb=400)
    config = TrainConfig(batch=4, seq=1024, resident=12, activations="cpu", streamed=0)
    p = plan(model, h200, config)
    assert p.ledger.resident == tuple(range(12))  # the embedding first, then layers 1, 2, ...
    kinds = [op.kind for op in p.graph.ops]
    assert kinds.count(OpKind.GPU_ADAM) == 3 * 12
    assert kinds.count(OpKind.ADAM) == 3 * (model.num_layers + 2 - 12)
    resident = p.ledger.breakdown("gpu")["resident layers (weights, grads, master, moments)"]
    assert resident == 16 * (model.embedding_params + 11 * model.layer_params)


def test_saved_plan_reloads_equal(llama8b, pc):
    p = plan(llama8b, pc, TrainConfig(batch=2, seq=128, steps=1, activations="gpu"))
    again = plan_from_json(plan_to_json(p))
    assert again.graph == p.graph and again.ledger == p.ledger


def test_bad_resident_count(llama8b, pc):
    with pytest.raises(ValueError, match="resident must be at most 34"):
        plan(llama8b, pc, TrainConfig(batch=1, seq=64, resident=99))


def test_infeasible_plan_reports_tier(pc):
    model = load_model("qwen2.5-72b")
    p = plan(model, replace(pc, ram_bytes=128 * 10**9), TrainConfig(batch=16, seq=1024))
    over = dict(p.ledger.overflows())
    assert over["cpu"] > 12 * model.total_params - 128 * 10**9 - 1


@pytest.mark.parametrize(
    ("stage", "per_param"),
    [
        (0, lambda d: 18),
        (1, lambda d: 6 + 12 / d),
        (2, lambda d: 2 + 16 / d),
        (3, lambda d: 18 / d),
    ],
)
def test_zero_stage_formulas(stage, per_param):
    from slide_ir.planning.ledger import zero_bytes_per_gpu

    p = 8_030_261_248
    for d in (1, 2, 8):
        assert zero_bytes_per_gpu(p, stage, d) == pytest.approx(per_param(d) * p, abs=1)


def test_zero_state_sizes_are_parameters():
    from slide_ir.planning.ledger import StateBytes, zero_bytes_per_gpu

    bf16_moments = StateBytes(moments=4)  # 2 + 4 + 4 + 4 = 14 B per parameter
    assert zero_bytes_per_gpu(1000, 0, 4, bf16_moments) == 14_000
    assert zero_bytes_per_gpu(1000, 3, 4, bf16_moments) == 3_500
    with pytest.raises(ValueError, match="stage must be 0, 1, 2 or 3"):
        zero_bytes_per_gpu(1000, 4, 2)


def test_per_unit_clipping_reads_the_gradient_once_more(llama8b, pc):
    """The norm pass re-reads the BF16 gradient: 2 B/param more for every update."""
    plain = plan(llama8b, pc, TrainConfig(batch=1, seq=64, steps=1, streamed=0)).graph.op(
        "s1.L3.adam"
    )
    clipped = plan(llama8b, pc, TrainConfig(batch=1, seq=64, steps=1, clip="per-unit", streamed=0))
    op = clipped.graph.op("s1.L3.adam")
    assert op.work.bytes - plain.work.bytes == 2 * llama8b.layer_params
    with pytest.raises(ValueError, match="clip must be one of none, per-unit, global"):
        TrainConfig(batch=1, seq=64, clip="layer")


def test_the_final_save_reads_gpu_kept_state_a_unit_at_a_time(llama8b):
    """The final save (`slide train`: `on_finish`, no hand-back) brings GPU-kept FP32 master
    weights and moments to host RAM one unit at a time: the largest unit's 12 B/param with FP32
    moments (8 with BF16); state already in host RAM is read where it is."""
    h200 = load_machine("h200-16c-128g")
    label = "final save, a GPU-kept unit at a time (fp32 master + moments)"
    whole = plan(llama8b, h200, TrainConfig(batch=8, seq=1024, resident=34, activations="cpu"))
    assert len(whole.ledger.resident) == llama8b.num_layers + 2
    head = unit_params(llama8b, llama8b.num_layers + 1)  # LM head + final norm: the largest
    assert head > llama8b.embedding_params > llama8b.layer_params
    assert whole.ledger.breakdown("cpu")[label] == 12 * head
    bf16 = TrainConfig(batch=8, seq=1024, resident=2, moments_dtype="bf16", activations="cpu")
    layers = build_ledger(llama8b, h200, bf16, resident=(1, 2))
    assert layers.breakdown("cpu")[label] == 8 * llama8b.layer_params
    sliding = plan(llama8b, h200, TrainConfig(batch=8, seq=1024, resident=0, streamed=4))
    assert label not in sliding.ledger.breakdown("cpu")
