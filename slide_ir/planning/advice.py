"""What would make an infeasible plan fit: each suggestion is checked against the ledger."""

from __future__ import annotations

import math
from dataclasses import replace

from slide_ir.planning.ledger import Ledger, build_ledger
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine, with_drives
from slide_ir.specs.hardware_parts import GIB
from slide_ir.specs.model import ModelSpec


def suggest_fixes(
    model: ModelSpec, machine: Machine, config: TrainConfig, ledger: Ledger
) -> list[str]:
    """Changes that make the plan fit, one line each, most specific first."""
    over = dict(ledger.overflows())
    out: list[str] = []
    if "gpu" in over:
        if config.activations == "gpu" and _fits(
            model, machine, replace(config, activations="cpu"), "gpu"
        ):
            out.append("keep activations in CPU memory (--activations cpu)")
        batch = _largest_batch(model, machine, config)
        if batch:
            out.append(f"reduce the batch to {batch} (--batch {batch})")
        if config.cache_depth > 2:
            two = replace(config, cache_units=2)
            if _fits(model, machine, two, "gpu"):
                out.append("use two GPU cache units (--cache-units 2)")
            elif not batch and (both := _largest_batch(model, machine, two)):
                out.append(f"two GPU cache units and batch {both} (--cache-units 2 --batch {both})")
        need = ledger.peak_bytes("gpu") / GIB
        out.append(f"use a GPU with at least {need:.1f} GiB")
    if "cpu" in over:
        trial = machine if machine.nvme else with_drives(machine, 1)
        extra = "" if machine.nvme else " --nvme 1"
        if (config.holds_landed_grads and config.may_spill_grads
                and _fits(model, machine, replace(config, held_grads="nvme"), "cpu")):  # fmt: skip
            out.append("hold global clipping's gradients on the optimizer's drives until the "
                       "norm (--held-grads nvme)")  # fmt: skip
        if config.deferred_updates and _fits(model, machine, replace(config, clip="per-unit"),
                                             "cpu"):  # fmt: skip
            out.append("clip each unit's gradient by its own norm (--clip per-unit): global "
                       "clipping keeps every host-updated gradient in RAM until the step's "
                       "norm is known")  # fmt: skip
        for field in ("optimizer", "activations"):
            if getattr(config, field) != "nvme":
                moved = replace(config, **{field: "nvme"})  # type: ignore[arg-type]
                if _fits(model, trial, moved, "cpu"):
                    out.append(f"move {field} state to NVMe (--{field} nvme"
                               f"{_drives_flag(model, trial, moved, extra)})")  # fmt: skip
        # the RAM whose usable share holds the peak, in GiB as --ram-gb takes it
        ram = math.ceil(ledger.peak_bytes("cpu") / (1.0 - config.host_margin) / GIB)
        out.append(f"more host RAM: at least {ram} GiB (--ram-gb {ram})")
    if "nvme" in over:
        need = ledger.peak_bytes("nvme") / GIB
        drives = _drives_needed(model, machine, config)
        how = f"--nvme {drives}" if drives else f"more than {MAX_DRIVES} drives of this model"
        out.append(f"more NVMe capacity: {need:.0f} GiB needed ({how})")
    return out


# the most drives a suggestion names (a server's NVMe bays)
MAX_DRIVES = 16


def _drives_needed(model: ModelSpec, machine: Machine, config: TrainConfig) -> int | None:
    """The fewest drives of the machine's model on which the NVMe tier fits (the files are
    striped over them), up to `MAX_DRIVES`."""
    for n in range(max(len(machine.nvme), 1), MAX_DRIVES + 1):
        if _fits(model, with_drives(machine, n), config, "nvme"):
            return n
    return None


def _drives_flag(model: ModelSpec, machine: Machine, config: TrainConfig, extra: str) -> str:
    """The drive count a move to NVMe needs beside its flag: `extra` where the drives it is
    judged on hold it, else the count that does, else the capacity it needs."""
    if _fits(model, machine, config, "nvme"):
        return extra
    drives = _drives_needed(model, machine, config)
    if drives:
        return f" --nvme {drives}"
    need = build_ledger(model, machine, config).peak_bytes("nvme") / GIB
    return f", and {need:.0f} GiB of NVMe: more than {MAX_DRIVES} drives of this model"


def _fits(model: ModelSpec, machine: Machine, config: TrainConfig, tier: str) -> bool:
    """Whether `tier` fits under `config` (other tiers are judged by their own suggestions)."""
    try:
        ledger = build_ledger(model, machine, config)
    except ValueError:
        return False
    return ledger.peak_bytes(tier) <= ledger.capacity_bytes(tier)


def _largest_batch(model: ModelSpec, machine: Machine, config: TrainConfig) -> int | None:
    """Largest batch below the requested one whose GPU ledger fits (bisection: GPU bytes grow
    with the batch)."""
    lo, hi = 0, config.batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ledger = build_ledger(model, machine, replace(config, batch=mid))
        if ledger.peak_bytes("gpu") <= ledger.capacity_bytes("gpu"):
            lo = mid
        else:
            hi = mid
    return lo or None
