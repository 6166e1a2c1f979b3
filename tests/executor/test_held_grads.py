"""Global clipping's gradients held on NVMe (`held_grads="nvme"`: beside the optimizer's state on
the drives, or on a drive with the state in RAM) train bit for bit as those held in RAM, and as the
plain loop with `clip_grad_norm_`; the graph writes each landed gradient to
its drive (freeing the landing slot) and reads it back before its update; the ledger holds a
landing ring, not a slot per gradient, and 2 B/param of them on the drives."""

from __future__ import annotations

import pytest
import test_global_clip
from hf_models import spec_of, tiny_config
from runs import assert_bitwise_equal, assert_matches_reference, graph_of, run_executor

from slide_ir import TrainConfig, load_machine
from slide_ir.ir.drives import grad_drive
from slide_ir.ir.graph import OpKind, PoolRole
from slide_ir.planning.ledger import build_ledger
from slide_ir.planning.planner import plan
from slide_ir.planning.units import unit_params

CASES = {
    "untied-1-drive": (False, 1, {"optimizer": "nvme"}),
    "tied-2-drives": (True, 2, {"optimizer": "nvme"}),
    "moments-only-2-drives": (False, 2, {"optimizer": "nvme-moments"}),
    "optimizer-in-ram-1-drive": (False, 1, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_held_on_nvme_trains_bitwise_as_held_in_ram(case: str) -> None:
    tied, drives, extra = CASES[case]
    config = {**test_global_clip.CLIP, **extra}
    on_drive = run_executor(tied, drives=drives, held_grads="nvme", **config)
    in_ram = run_executor(tied, drives=drives, held_grads="ram", **config)
    assert on_drive.losses == in_ram.losses
    assert_bitwise_equal(on_drive, in_ram)
    assert_matches_reference(on_drive, tied, config)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_gradient_goes_to_its_drive_and_back_before_its_update(case: str) -> None:
    tied, drives, extra = CASES[case]
    graph = graph_of(tied, drives=drives, held_grads="nvme", **test_global_clip.CLIP, **extra)
    ops = {op.id: op for op in graph.ops}
    spills = [op for op in graph.ops if op.id.endswith(".g.spill")]
    assert spills and all(op.kind == OpKind.NVME_WRITE for op in spills)
    for spill in spills:
        d2h = ops[spill.deps[0]]
        assert d2h.kind == OpKind.D2H_GRAD and spill.reads[0] == d2h.writes[0]
        assert spill.lane == f"nvme{grad_drive(spill.unit, drives)}"
        assert d2h.writes[0].slot in spill.releases  # the landing slot is free once written
        load = ops[spill.id.replace("g.spill", "g.load")]
        assert load.kind == OpKind.NVME_READ and spill.id in load.deps
        adam = ops[spill.id.replace("g.spill", "adam")]
        assert load.id in adam.deps and load.writes[0] in adam.reads
        assert load.writes[0].slot in adam.releases


def test_the_ledger_holds_a_landing_ring_and_the_gradients_on_the_drives() -> None:
    spec = spec_of(tiny_config("llama", num_hidden_layers=6))
    machine = load_machine("h200-16c-128g", nvme=2)
    common = {"batch": 2, "seq": 16, "activations": "cpu", "optimizer": "nvme", "clip": "global"}
    ram = build_ledger(spec, machine, TrainConfig(**common, held_grads="ram"))
    drive = build_ledger(spec, machine, TrainConfig(**common, held_grads="nvme"))

    def slots(led, role):  # type: ignore[no-untyped-def]
        return {t.pool.name: t.pool.slots for t in led.terms if t.pool.role == role}

    assert slots(ram, PoolRole.GRAD_LANDING)["pinned_grads_layers"] == 6  # one per gradient
    assert slots(drive, PoolRole.GRAD_LANDING)["pinned_grads_layers"] == 3  # a ring
    assert not slots(ram, PoolRole.NVME_GRADS)
    held = sum(t.bytes for t in drive.terms if t.pool.role == PoolRole.NVME_GRADS)
    assert held == 2 * sum(unit_params(spec, u) for u in range(spec.num_layers + 2))
    assert drive.peak_bytes("cpu") < ram.peak_bytes("cpu")


def test_held_on_nvme_without_a_drive_is_refused_naming_the_fix() -> None:
    spec = spec_of(tiny_config("llama"))
    config = TrainConfig(batch=2, seq=16, activations="cpu", clip="global", held_grads="nvme")
    with pytest.raises(ValueError, match=r"needs at least one NVMe drive.*--held-grads ram"):
        build_ledger(spec, load_machine("h200-16c-128g", nvme=0), config)


def test_held_on_nvme_refuses_speculated_updates() -> None:
    config = TrainConfig(batch=2, seq=16, clip="global", held_grads="nvme", speculate=2)
    with pytest.raises(ValueError, match="speculate=2: a speculated update keeps its gradient"):
        config.check_held_grads()
    assert TrainConfig(batch=2, seq=16, clip="global", held_grads="nvme").speculated == 0


def test_a_speculation_count_asked_for_keeps_the_auto_gradients_in_ram() -> None:
    """`held_grads="auto"` on a machine with a drive, `speculate=2`: the plan speculates, its
    gradients in RAM (the drive's plan, which dropped the count, was chosen before)."""
    spec = spec_of(tiny_config("llama", num_hidden_layers=6))
    machine = load_machine("paper-pc-4090")
    asked = plan(spec, machine, TrainConfig(batch=2, seq=16, clip="global", speculate=2))
    assert not asked.config.spills_grads
    assert asked.config.speculated > 0  # (fewer than 2 where fewer units update on the host)
