"""Capacity: the largest model a machine can fine-tune, per placement and moment precision.

Fitting is a question for the memory ledger alone (no simulation): a model fits when no tier
overflows. Two answers per placement:

- the largest *catalog* model that fits;
- along each model family (catalog names sharing a prefix: `qwen2.5-*`), the largest parameter
  count reachable by depth scaling between the largest member that fits and the next one up
  (`family_scaling`), so "14B fits, 32B does not" becomes "up to ~18B of this family fits".
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from slide_ir.planning.placement import plan_fits, smallest_ledger
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model, model_names

log = logging.getLogger(__name__)


def fits(model: ModelSpec, machine: Machine, config: TrainConfig) -> bool:
    """Whether the planner's plan of `config` fits (its placement search included)."""
    return plan_fits(model, machine, config)


def family(name: str) -> str:
    """`qwen2.5-14b` -> `qwen2.5`, `llama-3.1-70b` -> `llama-3.1`."""
    return name.rpartition("-")[0] or name


def _with_depth(model: ModelSpec, layers: int) -> ModelSpec:
    return replace(model, name=f"{model.name}@{layers}L", num_layers=layers, hf_config_json="")


def _deepest(model: ModelSpec, machine: Machine, config: TrainConfig, lo: int, hi: int) -> int:
    """Largest depth in [lo, hi] that fits, given that `lo` fits (0: none need fit)."""
    if fits(_with_depth(model, hi), machine, config):
        return hi
    while hi - lo > 1:  # lo fits (or is 0), hi does not
        mid = (lo + hi) // 2
        if fits(_with_depth(model, mid), machine, config):
            lo = mid
        else:
            hi = mid
    return lo


def family_scaling(
    members: list[ModelSpec], machine: Machine, config: TrainConfig, fit: dict[str, bool]
) -> dict[str, Any]:
    """Largest parameter count between the largest member that fits and the next one up.

    Two depth-scaled candidates, the larger wins: the next member with fewer layers (its width),
    and the largest fitting member with more layers (its width, up to the next member's size).
    No extrapolation past the family's largest member.
    """
    members = sorted(members, key=lambda m: m.total_params)
    fitting = [m for m in members if fit[m.name]]
    largest = fitting[-1] if fitting else None
    too_big = next((m for m in members if not fit[m.name]), None)
    best = (largest, largest.num_layers) if largest else (None, 0)
    if too_big is not None:
        candidates = [(too_big, _deepest(too_big, machine, config, 0, too_big.num_layers))]
        if largest is not None:
            cap = _depth_below(largest, too_big.total_params)
            candidates.append(
                (largest, _deepest(largest, machine, config, largest.num_layers, cap))
            )
        for model, depth in candidates:
            if depth and _params(model, depth) > _params(*best):
                best = (model, depth)
    base, depth = best
    return {
        "largest_member": largest.name if largest else None,
        "largest_member_params": largest.total_params if largest else 0,
        "scaled_from": base.name if base else None,
        "scaled_layers": depth,
        "scaled_params": _params(base, depth),
        "all_members_fit": too_big is None,
    }


def _params(model: ModelSpec | None, depth: int) -> int:
    return _with_depth(model, depth).total_params if model is not None and depth else 0


def _depth_below(model: ModelSpec, params: int) -> int:
    """Most layers `model` can have while staying under `params` (at least its own depth)."""
    rest = model.total_params - model.num_layers * model.layer_params
    return max(model.num_layers, (params - 1 - rest) // model.layer_params)


def capacity(machine: Machine, config: TrainConfig) -> dict[str, Any]:
    """What fits `machine` with `config`'s placement (batch and seq matter for activations)."""
    specs = [load_model(n) for n in model_names()]
    fit = {m.name: fits(m, machine, config) for m in specs}
    fitting = [m for m in specs if fit[m.name]]
    best = max(fitting, key=lambda m: m.total_params, default=None)
    families: dict[str, list[ModelSpec]] = {}
    for m in specs:
        families.setdefault(family(m.name), []).append(m)
    host = smallest_ledger(best, machine, config).peak_bytes("cpu") if best else 0
    return {
        "activations": config.activations,
        "optimizer": config.optimizer,
        "moments": config.moments_dtype,
        "largest_model": best.name if best else None,
        "largest_model_params": best.total_params if best else 0,
        # host RAM per parameter of that model at the smallest footprint (what decides the fit)
        "host_bytes_per_param": round(host / best.total_params, 3) if best else None,
        "models": {m.name: {"params": m.total_params, "fits": fit[m.name]} for m in specs},
        "families": {
            name: family_scaling(members, machine, config, fit)
            for name, members in sorted(families.items())
        },
    }


def placements(machine: Machine) -> list[tuple[str, str]]:
    """(activations, optimizer) placements worth reporting on this machine."""
    out = [("cpu", "cpu")]
    if machine.nvme:
        out += [("cpu", "nvme-moments"), ("cpu", "nvme"), ("nvme", "nvme")]
    return out
