"""SlideFormer's host RAM as its code allocates it, against a hand count; Slide's smallest
footprint at or below it for every catalog model in every mode; and the planner's fallback to the
lean copy buffers where only they fit, never a plan that does not."""

from __future__ import annotations

import pytest

from slide_ir.ir.graph import PoolRole
from slide_ir.planning.placement import plan_fits, smallest_ledger
from slide_ir.planning.planner import plan
from slide_ir.planning.slideformer_footprint import slideformer_host_bytes
from slide_ir.planning.units import GIB
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model, model_names

DATA_PATH = (PoolRole.HOST_TOKENS, PoolRole.HOST_LOSSES)
MODES = [(o, m, a) for o in ("cpu", "nvme-moments", "nvme") for m in ("fp32", "bf16")
         for a in ("cpu", "nvme")]  # fmt: skip


def test_slideformers_count_for_llama_3b_is_the_hand_count() -> None:
    """Tied llama-3.2-3b at batch 16: master and moments 12 B/param, the gradient and convert
    buffers the largest unit in BF16 (the final norm with the 128256 x 3072 output matrix), the
    tied embedding's accumulator, 28 inputs of 16 x 1024 x 3072 in BF16, and the 2 GiB process
    runtime: its own estimate (40.73 GiB) plus the runtime."""
    model = load_model("llama-3.2-3b")
    got = slideformer_host_bytes(model, TrainConfig(batch=16, seq=1024, activations="cpu"))
    vocab = 128256 * 3072
    hand = (12 * model.total_params + 2 * (vocab + 3072) * 2 + vocab * 2
            + 28 * 16 * 1024 * 3072 * 2 + 2 * GIB)  # fmt: skip
    assert sum(got.values()) == hand
    assert "moments in flight" not in got
    assert round((hand - 2 * GIB) / GIB, 2) == 40.73


def test_with_moments_on_nvme_slideformer_holds_its_master_and_those_in_flight() -> None:
    model = load_model("qwen2.5-14b")  # untied: the embedding and the head, 152064 x 5120 each
    config = TrainConfig(batch=1, seq=1024, activations="nvme", optimizer="nvme-moments")
    got = slideformer_host_bytes(model, config)
    assert got["fp32 master"] == 4 * model.total_params and "adam moments" not in got
    assert "layer inputs" not in got
    head = 152064 * 5120 + 5120  # with the final norm
    assert got["moments in flight"] == 8 * (152064 * 5120 + head + model.layer_params)


@pytest.mark.parametrize("mode", MODES, ids="-".join)
def test_the_smallest_footprint_is_at_most_slideformers_for_every_model(mode) -> None:
    """With the layer inputs on NVMe, Slide stages each copy through one pinned slot (one
    input, b x s x h in BF16) where SlideFormer writes from the GPU through kvikio (whose bounce
    buffers, without GPUDirect Storage, its count leaves out): that slot is one allowance; the
    other is the data path's host buffers (staged micro-batches, step losses), which its count
    leaves out too (its loader's batch)."""
    optimizer, moments, acts = mode
    machine = load_machine("paper-pc-4090")
    for batch in (1, 16):
        config = TrainConfig(batch=batch, seq=1024, optimizer=optimizer, moments_dtype=moments,
                             activations=acts, clip="none")  # fmt: skip
        for name in model_names():
            model = load_model(name)
            ledger = smallest_ledger(model, machine, config)
            ours = ledger.peak_bytes("cpu")
            theirs = sum(slideformer_host_bytes(model, config).values())
            staging = batch * 1024 * model.hidden_size * 2 if acts == "nvme" else 0
            staging += sum(t.bytes for t in ledger.terms if t.pool.role in DATA_PATH)
            assert ours <= theirs + staging, (name, batch, ours / 2**30, theirs / 2**30)


def test_the_planner_falls_back_to_lean_buffers_where_only_they_fit() -> None:
    model = load_model("qwen2.5-14b")
    config = TrainConfig(batch=1, seq=1024, activations="cpu", clip="none", steps=1)
    lean = smallest_ledger(model, load_machine("paper-pc-4090"), config).peak_bytes("cpu")
    between = (lean + 1.5 * GIB) / 0.95 / GIB  # RAM whose usable 95% holds lean, not the rings
    machine = load_machine("paper-pc-4090", ram_gb=between)
    p = plan(model, machine, config)
    assert p.choice is not None and p.choice.chosen.lean and p.ledger.feasible
    assert p.config.lean_buffers and plan_fits(model, machine, config)
    short = load_machine("paper-pc-4090", ram_gb=(lean - 0.5 * GIB) / 0.95 / GIB)
    assert not plan_fits(model, short, config)
    assert not plan(model, short, config).ledger.feasible


def test_lean_buffers_asked_for_are_kept_by_the_search_and_judged_as_a_floor() -> None:
    """`--lean-buffers` on a machine where everything fits: every candidate the search times is
    lean, and the smallest lean placement fits like the smallest one (the GPU holds the same)."""
    model, machine = load_model("llama-3.2-3b"), load_machine("paper-pc-4090")
    config = TrainConfig(batch=16, seq=1024, clip="none", steps=1, lean_buffers=True)
    p = plan(model, machine, config)
    assert p.choice is not None and p.ledger.feasible
    assert all(c.placement.lean for c in p.choice.considered) and p.config.lean_buffers
    small = plan(model, machine, TrainConfig(batch=16, seq=1024, clip="none", steps=1,
                                             lean_buffers=True, placement="small"))  # fmt: skip
    assert small.choice is not None and small.choice.chosen.lean and small.ledger.feasible
