"""ZeRO-Offload as DeepSpeed runs it (ZeRO-2, CPU offload, one GPU): gradient reduce buckets,
their downloads on the compute stream as the backward produces them, the update after."""

import pytest

from slide_ir import TrainConfig, load_machine, load_model
from slide_ir.ir.graph import OpKind
from slide_ir.ir.printing import format_graph, parse_graph
from slide_ir.planning.planner import plan
from slide_ir.planning.units import BF16, FP32
from slide_ir.planning.zero_offload import BUCKET_POOL, WHOLE_POOL, grad_buckets


def test_buckets_of_8b_at_deepspeeds_default_size(llama8b):
    """5e8 elements hold two 218M-parameter layers; the 525M embedding and LM head exceed a
    bucket and go down alone, as DeepSpeed's extra-large parameters."""
    buckets = grad_buckets(llama8b, TrainConfig(batch=16, seq=1024, schedule="zero-offload"))
    assert [b.units for b in buckets] == [(33,), *[(j, j - 1) for j in range(32, 0, -2)], (0,)]
    assert [b.pool for b in buckets] == [WHOLE_POOL, *[BUCKET_POOL] * 16, WHOLE_POOL]
    assert all(b.elements <= 5e8 for b in buckets if b.pool == BUCKET_POOL)
    assert buckets[1].offsets == (0, llama8b.layer_params)
    assert sum(b.elements for b in buckets) == llama8b.total_params


def test_tied_embedding_kept_whole_and_small_buckets_fill_greedily():
    model = load_model("llama-3.2-1b")  # tied: the loss writes the embedding's gradient
    config = TrainConfig(batch=2, seq=128, schedule="zero-offload", reduce_bucket=130_000_000)
    buckets = grad_buckets(model, config)
    assert buckets[0].units == (17, 16, 15)  # the head is the final norm only
    assert buckets[-1].units == (0,) and buckets[-1].pool == WHOLE_POOL
    assert all(len(b.units) == 2 for b in buckets[1:-2])


def test_8b_batch_16_fits_the_4090_as_deepspeed_ran_it(llama8b):
    led = plan(llama8b, load_machine("paper-pc-4090"),
               TrainConfig(batch=16, seq=1024, schedule="zero-offload")).ledger  # fmt: skip
    assert led.feasible, led.overflows()
    pools = {t.pool.name: t.pool for t in led.terms}
    assert "gpu_grads" not in pools  # no whole-model gradient on the GPU
    assert pools[BUCKET_POOL].bytes == 500_000_000 * BF16
    head = llama8b.lm_head_params + llama8b.final_norm_params  # the larger of the two kept whole
    assert pools[WHOLE_POOL].bytes == head * BF16
    assert pools["pinned_grads"].bytes == llama8b.total_params * FP32  # DeepSpeed's FP32 grads
    gpu = led.peak_bytes("gpu")
    assert 2 * llama8b.total_params < gpu < 2 * llama8b.total_params + 9e9


def test_flushes_on_the_compute_stream_then_the_update(llama8b):
    g = plan(llama8b, load_machine("paper-pc-4090"),
             TrainConfig(batch=2, seq=256, steps=2, schedule="zero-offload")).graph  # fmt: skip
    gpu = [op.id for op in g.lane_ops("gpu")]
    # layers 32 and 31 share a bucket: both go down after layer 31's backward, before 30 runs
    at = gpu.index("s1.L31.bwd")
    assert gpu[at + 1 : at + 4] == ["s1.L32.g.d2h", "s1.L31.g.d2h", "s1.L30.recompute"]
    assert gpu[gpu.index("s1.L33.loss") + 1] == "s1.L33.g.d2h"  # the LM head alone
    d2h = [op for op in g.ops if op.kind == OpKind.D2H_GRAD and op.step == 1]
    assert sum(op.work.bytes for op in d2h) == FP32 * llama8b.total_params
    assert g.op("s1.L33.adam").deps == ("s1.L0.g.d2h",)
    casts = [op.id for op in g.lane_ops("cpu") if op.step == 1]
    assert casts.index("s1.L0.adam") < casts.index("s1.L33.cast")  # cast after every update
    assert g.op("s1.L5.w.h2d").deps == ("s1.L0.cast",)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"grad_accum": 2}, {"reduce_bucket": 20_000_000}, {"optimizer": "nvme"}],
)
def test_graphs_validate_and_round_trip(overrides):
    model = load_model("llama-3.2-1b")
    p = plan(model, load_machine("paper-pc-4090", nvme=1),
             TrainConfig(batch=2, seq=128, steps=2, schedule="zero-offload", **overrides))  # fmt: skip
    assert parse_graph(format_graph(p.graph)) == p.graph
    d2h = [op for op in p.graph.ops if op.kind == OpKind.D2H_GRAD]
    assert len(d2h) == 2 * (model.num_layers + 2) * p.config.grad_accum
