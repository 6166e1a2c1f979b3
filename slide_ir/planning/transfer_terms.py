"""The ledger's terms for the pinned buffers the link's copies land in and read from: the
sliding gradients' landing (a slot shared by the embedding and the head, a ring for the decoder
layers), the host BF16 weights that uploads read, and the ring that casts from the master fill
instead (`slide_ir.planning.weight_ring`).
"""

from __future__ import annotations

from slide_ir.ir.drives import grad_drive, grad_pool
from slide_ir.ir.graph import Pool, Tier
from slide_ir.ir.graph import PoolRole as R
from slide_ir.planning.terms import Terms, unit_groups
from slide_ir.planning.units import BF16, FP32, unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec


def landing_terms(
    terms: Terms,
    model: ModelSpec,
    config: TrainConfig,
    host_updated: list[int],
    *,
    gpu_updated: bool,
) -> None:
    """Pinned landing for the host-updated units' gradients: a slot for the vocab-sized units
    and a ring for the decoder layers, or with `lean_buffers` one slot the size of the largest
    that every unit's download (and read back from NVMe, for a held gradient) waits its turn
    for, unless each waits for the norm in its own (`holds_landed_grads`). qwen2.5-14b:
    1 x 7.79e8 params x 2 B = 1.56 GB, against 3.21 GB."""
    landed = [u for u in host_updated if unit_params(model, u)]
    if config.lean_buffers and not config.holds_landed_grads and landed:
        q = max(unit_params(model, u) for u in landed)
        terms.add("pinned_grads_shared", Tier.PINNED, 1, q * BF16, "gradient landing (pinned)",
                  f"1 x {q:.4g} params (the largest unit) x 2 B", role=R.GRAD_LANDING,
                  units=tuple(landed))  # fmt: skip
        return
    n = model.num_layers
    vocab_landing_terms(terms, model, config, [u for u in host_updated if u in (0, n + 1)])
    layer_landing_terms(terms, model, config, host_updated, gpu_updated=gpu_updated)


def vocab_landing_terms(
    terms: Terms, model: ModelSpec, config: TrainConfig, units: list[int]
) -> None:
    """Pinned landing for the host-updated embedding and head (the vocab-sized units). Their
    gradients come down at the two ends of the backward: the head's first, its update done
    (on the `cpu` lane, first of the step's) while the decoder layers' backward runs, the
    embedding's last. So both share one slot the size of the larger (`pinned_grads_vocab`): the
    embedding's download waits for the head's update to free it, the ring reuse of the
    graph. Under deferred updates (global clipping) every gradient waits for the norm in a
    buffer of its own, and each keeps its own slot. 8B: 2 x 5.25e8 x 2 B = 2.10 GB -> 1.05 GB."""
    groups = list(unit_groups(model, units))
    if len(groups) > 1 and not config.holds_landed_grads:
        groups = [("vocab", units)]
    for group, members in groups:
        q = max(unit_params(model, u) for u in members)
        terms.add(f"pinned_grads_{group}", Tier.PINNED, 1, q * BF16,
                  "gradient landing (pinned)", f"{q:.4g} params (the largest of units "
                  f"{', '.join(map(str, members))}) x 2 B", role=R.GRAD_LANDING,
                  units=tuple(members))  # fmt: skip


def layer_landing_terms(
    terms: Terms,
    model: ModelSpec,
    config: TrainConfig,
    host_updated: list[int],
    *,
    gpu_updated: bool,
) -> None:
    """Pinned landing for the host-updated decoder layers' gradients: a ring of
    `landing_buffers` slots, one layer each."""
    n, p = model.num_layers, model.layer_params
    layers = tuple(u for u in host_updated if 1 <= u <= n)
    if layers:
        g = landing_buffers(config, len(layers), gpu_updated=gpu_updated)
        terms.add("pinned_grads_layers", Tier.PINNED, g, p * BF16, "gradient landing (pinned)",
                  f"{g} x {p:.4g} params x 2 B", role=R.GRAD_LANDING, units=layers)  # fmt: skip


def held_grad_terms(
    terms: Terms, model: ModelSpec, config: TrainConfig, host_updated: list[int], drives: int
) -> None:
    """Global clipping's held gradients on NVMe (`TrainConfig.spills_grads`): each unit's
    whole, in the compute dtype, on drive `grad_drive(unit)`."""
    if not config.spills_grads:
        return
    for k in range(drives):
        on_drive = [u for u in host_updated if grad_drive(u, drives) == k]
        for group, members in unit_groups(model, on_drive):
            terms.add_group(f"{grad_pool(k)}_{group}", Tier.NVME, members,
                            unit_params(model, members[0]), BF16, "held gradients (NVMe)",
                            role=R.NVME_GRADS)  # fmt: skip


def landing_pool(pools: tuple[Pool, ...] | list[Pool], unit: int) -> str:
    """The name of the sliding gradient-landing pool whose slots hold `unit`'s gradient."""
    for pool in pools:
        if pool.role == R.GRAD_LANDING and unit in pool.units:
            return pool.name
    raise ValueError(f"no gradient landing pool holds unit {unit}")


def landing_buffers(config: TrainConfig, host_layers: int, *, gpu_updated: bool) -> int:
    """Pinned landing buffers for decoder-layer gradients (a ring). Three keep the d2h lane
    busy while the CPU updates. With units updated on the GPU (resident or streamed) the
    backward must run ahead of the CPU through the host-updated layers (the deepest ones, whose
    backward comes first) to reach them, so by default every host-updated layer gets a buffer:
    2 B/param more of pinned RAM for those layers. (8B on the H200 at batch 16 with 23 resident
    units: 2.10 s per step with 3 buffers, 1.62 s with one for each of its 10 sliding layers,
    by prediction.) With deferred updates (global clipping) every gradient waits for the norm
    in a buffer of its own, whatever `grad_buffers` asks (unless it waits on NVMe:
    `held_grad_terms`)."""
    if config.holds_landed_grads:
        return host_layers
    if config.grad_buffers is not None:
        return config.grad_buffers
    return max(3, host_layers) if gpu_updated else 3


def host_weight_terms(terms: Terms, model: ModelSpec, units: list[int]) -> None:
    """The pinned BF16 copy of each of `units` that its upload reads (written by its update)."""
    for group, members in unit_groups(model, units):
        terms.add_group(f"pinned_bf16_{group}", Tier.PINNED, members,
                        unit_params(model, members[0]), BF16, "bf16 weights (pinned)",
                        role=R.HOST_WEIGHTS)  # fmt: skip


def weight_ring_slots(config: TrainConfig) -> int:
    """Slots of the weight-staging ring: one being cast while the one before it is uploaded;
    with `lean_buffers` one, each cast waiting for the upload before it."""
    return 1 if config.lean_buffers else 2


def cast_units(config: TrainConfig, host_updated: list[int]) -> list[int]:
    """The host-updated units whose uploads are cast from the master into the weight ring
    (`TrainConfig.host_weights`, "auto" as "cast": the smallest footprint). A master on NVMe
    is read into `master_staging_terms` for each cast."""
    if config.host_weights == "pinned":
        return []
    return host_updated


def master_staging_terms(
    terms: Terms, model: ModelSpec, config: TrainConfig, units: list[int], drives: int
) -> None:
    """With the master on NVMe (`--optimizer nvme`), the RAM each cast reads it into: per
    weight-ring slot one stripe per drive, each a stripe of the largest of `units` (pageable:
    only the cpu lane reads it)."""
    if config.optimizer != "nvme" or not units:
        return
    largest = max(unit_params(model, u) for u in units)
    slots = weight_ring_slots(config)
    stripe, k = -(-largest // drives), slots * drives
    terms.add("master_staging", Tier.CPU, k, stripe * FP32, "fp32 master read for a cast",
              f"{slots} x {drives} drive stripes of {stripe:.4g} params x 4 B",
              role=R.MASTER_STAGING, units=tuple(units))  # fmt: skip


def weight_ring_terms(
    terms: Terms, model: ModelSpec, config: TrainConfig, units: list[int]
) -> None:
    """The pinned ring the casts of `units` fill and their uploads read, a slot the size of
    the largest of them (`slide_ir.planning.weight_ring`)."""
    largest = max((unit_params(model, u) for u in units), default=0)
    k = weight_ring_slots(config)
    terms.add("pinned_weight_ring", Tier.PINNED, k, largest * BF16,
              "bf16 weight staging ring (pinned)",
              f"{k} x {largest:.4g} params (the largest unit) x 2 B", role=R.WEIGHT_STAGING, units=tuple(units))  # fmt: skip
