"""The weight ring in the ledger and the planner: host bytes per parameter per optimizer mode
against hand counts, the ring's size, the choice `host_weights="auto"` makes, and a capacity
search whose answers fit as planned."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slide_ir.ir.graph import OpKind, PoolRole
from slide_ir.planning.capacity import capacity
from slide_ir.planning.ledger import build_ledger
from slide_ir.planning.planner import plan
from slide_ir.planning.transfer_terms import weight_ring_slots
from slide_ir.planning.units import unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model

R = PoolRole
STATE_ROLES = (R.MASTER, R.MOMENTS, R.HOST_WEIGHTS)

# (optimizer, moments) -> host bytes/param of master + moments + pinned weight copy, by hand:
# master 4 B in RAM unless on NVMe; moments 8 B (FP32) or 4 B (BF16) unless on NVMe; the pinned
# copy 2 B, except where uploads cast (from the master in RAM, or read off the drive)
HAND = {
    ("cpu", "fp32"): {"cast": 12, "pinned": 14},
    ("cpu", "bf16"): {"cast": 8, "pinned": 10},
    ("nvme-moments", "fp32"): {"cast": 4, "pinned": 6},
    ("nvme-moments", "bf16"): {"cast": 4, "pinned": 6},
    ("nvme", "fp32"): {"cast": 0, "pinned": 2},
    ("nvme", "bf16"): {"cast": 0, "pinned": 2},
}


def _config(**kw: object) -> TrainConfig:
    return TrainConfig(batch=1, seq=1024, activations="cpu", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", sorted(HAND), ids="-".join)
@pytest.mark.parametrize("weights", ["cast", "pinned"])
def test_state_bytes_per_param_are_the_hand_counts(llama8b, pc, mode, weights) -> None:
    optimizer, moments = mode
    config = _config(optimizer=optimizer, moments_dtype=moments, host_weights=weights)
    led = build_ledger(llama8b, pc, config)
    state = sum(t.bytes for t in led.terms if t.pool.role in STATE_ROLES)
    assert state == HAND[mode][weights] * llama8b.total_params


@pytest.mark.parametrize("optimizer", ["cpu", "nvme-moments", "nvme"])
@pytest.mark.parametrize("lean", [False, True], ids=["two-slots", "lean"])
def test_the_ring_is_slots_times_the_largest_unit(llama8b, pc, optimizer, lean) -> None:
    config = _config(optimizer=optimizer, host_weights="cast", lean_buffers=lean)
    led = build_ledger(llama8b, pc, config)
    (ring,) = [t.pool for t in led.terms if t.pool.role == R.WEIGHT_STAGING]
    largest = max(unit_params(llama8b, u) for u in range(llama8b.num_layers + 2))
    slots = weight_ring_slots(config)
    assert slots == (1 if lean else 2)
    assert ring.tier == "pinned" and not ring.static
    assert ring.bytes == slots * largest * 2
    assert set(ring.units) == set(range(llama8b.num_layers + 2))
    staging = [t.pool for t in led.terms if t.pool.role == R.MASTER_STAGING]
    if optimizer != "nvme":
        assert not staging  # the casts read the master in RAM
        return
    (read,) = staging  # the master read off the one drive, a slot per ring slot
    assert read.tier == "cpu" and read.slots == slots
    assert read.bytes == slots * largest * 4


def test_gpu_updated_units_keep_their_pinned_copy(llama8b, pc) -> None:
    """Streamed units' new weights come down from the GPU into their pinned copy; resident
    units have none; the host-updated rest cast."""
    led = build_ledger(llama8b, pc, _config(host_weights="cast"), resident=(0,), streamed=(1, 2))
    copies = {u for t in led.terms if t.pool.role == R.HOST_WEIGHTS for u in t.pool.units}
    (ring,) = [t.pool for t in led.terms if t.pool.role == R.WEIGHT_STAGING]
    assert copies == {1, 2}
    assert set(ring.units) == set(range(3, llama8b.num_layers + 2))


def test_the_update_writes_no_copy_and_is_priced_without_it(llama8b, pc) -> None:
    graphs = {w: plan(llama8b, pc, _config(steps=1, placement="small", host_weights=w)).graph
              for w in ("cast", "pinned")}  # fmt: skip
    cast, pinned = graphs["cast"].op("s1.L3.adam"), graphs["pinned"].op("s1.L3.adam")
    assert pinned.work.bytes - cast.work.bytes == 2 * llama8b.layer_params
    assert len(cast.writes) == len(pinned.writes) - 1
    casts = [op for op in graphs["cast"].ops if op.kind == OpKind.CAST]
    # every upload of a host-updated unit: the forward's, and the backward's re-uploads
    h2d = [op for op in graphs["cast"].ops if op.kind == OpKind.H2D_PARAM]
    assert len(casts) == len(h2d) and not any(op.kind == OpKind.CAST for op in graphs["pinned"].ops)
    assert casts[0].work.bytes == 6 * unit_params(llama8b, casts[0].unit)


def test_auto_keeps_the_faster_plan_that_fits(llama8b, pc) -> None:
    """On the 4090 host the casts lengthen the cpu lane, so auto keeps the pinned copy where it
    fits; with RAM for the cast layout only, auto casts (and fits)."""
    config = _config(steps=3)
    both = {w: plan(llama8b, pc, TrainConfig(**{**_fields(config), "host_weights": w}))
            for w in ("cast", "pinned")}  # fmt: skip
    auto = plan(llama8b, pc, config)
    faster = min(both, key=lambda w: both[w].choice.predicted_step_s)  # type: ignore[union-attr]
    assert auto.config.host_weights == faster
    small = TrainConfig(**{**_fields(config), "placement": "small"})
    need = {w: plan(llama8b, pc, replace(small, host_weights=w)).ledger.peak_bytes("cpu")
            for w in ("cast", "pinned")}  # fmt: skip
    assert need["cast"] < need["pinned"]
    tight = load_machine("paper-pc-4090", ram_gb=(need["cast"] + need["pinned"]) / 2 / 0.95 / 2**30)
    chosen = plan(llama8b, tight, small)
    assert chosen.feasible and chosen.config.host_weights == "cast"


def _fields(config: TrainConfig) -> dict:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


@pytest.mark.parametrize("ram_gb", [100, 250])
def test_capacity_answers_only_models_whose_plan_fits(ram_gb) -> None:
    machine = load_machine("paper-pc-4090", ram_gb=ram_gb)
    config = TrainConfig(batch=1, seq=1024, activations="cpu", optimizer="cpu")
    found = capacity(machine, config)
    assert found["largest_model"] is not None
    p = plan(load_model(found["largest_model"]), machine, config)
    assert p.feasible, p.ledger.overflows()
    assert found["host_bytes_per_param"] < 14
