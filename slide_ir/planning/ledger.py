"""The memory ledger: bytes per tier as closed formulas with named terms.

Each term *is* a pool of the schedule IR (equal slots on one tier), plus a human label and the
formula it came from. The planner turns terms into the Graph's pools one for one, so the ledger is
also the documentation of what an engine allocates: reserved bytes per tier == ledger peak.

Tiers for reporting: `gpu`, `cpu` (all host RAM: pinned + pageable) and `nvme`.

Here: the `Ledger`, `build_ledger` and each schedule's list of terms, in the order the Graph's pools
take. The terms themselves are built by job: the compute and the process (`compute_terms`), the
training state and its copies (`state_terms`), the link's pinned buffers (`transfer_terms`).

Units (`slide_ir.planning.units`): `resident` units live whole on the GPU; `streamed`
units slide, but their AdamW runs on the GPU: their FP32 master and moments sit in pinned RAM
and visit a GPU staging ring around the update.
"""

from __future__ import annotations

from dataclasses import dataclass

from slide_ir.ir.graph import Dtype, Pool, Tier
from slide_ir.ir.graph import PoolRole as R
from slide_ir.planning.compute_terms import (
    activation_terms,
    common_gpu_terms,
    host_terms,
    tape_terms,
)
from slide_ir.planning.state_terms import (
    global_clip_terms,
    grad_accum_terms,
    handback_terms,
    optimizer_terms,
    rollback_terms,
    streamed_staging_terms,
)
from slide_ir.planning.terms import Term, Terms, unit_groups
from slide_ir.planning.transfer_terms import (
    cast_units,
    held_grad_terms,
    host_weight_terms,
    landing_terms,
    master_staging_terms,
    weight_ring_terms,
)
from slide_ir.planning.units import BF16, FP32, GIB, resident_preference, unit_params
from slide_ir.planning.zero_offload import (
    BUCKET_POOL,
    WHOLE_POOL,
    grad_buckets,
    largest_param,
    whole_slot_elements,
)
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

REPORT_TIERS = ("gpu", "cpu", "nvme")


@dataclass(frozen=True, kw_only=True, slots=True)
class Ledger:
    schedule: str
    terms: tuple[Term, ...]
    gpu_capacity: int
    cpu_capacity: int
    nvme_capacity: int
    resident: tuple[int, ...] = ()  # units kept whole on the GPU
    streamed: tuple[int, ...] = ()  # sliding units updated on the GPU, state streamed

    def peak_bytes(self, tier: str) -> int:
        return sum(t.bytes for t in self.terms if t.report_tier == tier)

    def pinned_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.pool.tier == Tier.PINNED)

    def capacity_bytes(self, tier: str) -> int:
        return {"gpu": self.gpu_capacity, "cpu": self.cpu_capacity, "nvme": self.nvme_capacity}[
            tier
        ]

    def breakdown(self, tier: str) -> dict[str, int]:
        """Bytes per label (terms sharing a label are summed), largest first."""
        out: dict[str, int] = {}
        for t in self.terms:
            if t.report_tier == tier:
                out[t.label] = out.get(t.label, 0) + t.bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def overflows(self) -> list[tuple[str, int]]:
        """(tier, bytes over capacity) for every tier that does not fit."""
        over = [(tier, self.peak_bytes(tier) - self.capacity_bytes(tier)) for tier in REPORT_TIERS]
        return [(tier, b) for tier, b in over if b > 0]

    @property
    def feasible(self) -> bool:
        return not self.overflows()

    def pools(self) -> tuple[Pool, ...]:
        return tuple(t.pool for t in self.terms)


def build_ledger(
    model: ModelSpec,
    machine: Machine,
    config: TrainConfig,
    resident: tuple[int, ...] = (),
    streamed: tuple[int, ...] = (),
) -> Ledger:
    """The ledger of `config.schedule`. `resident` and `streamed` apply to the sliding schedule
    only."""
    if config.activations == "auto":
        raise ValueError(
            "activations='auto' is chosen by the planner (slide_ir.planning.planner.plan); a ledger needs "
            "gpu, cpu or nvme"
        )
    drives = len(machine.nvme)
    if drives == 0 and "nvme" in (config.optimizer, config.activations):
        raise ValueError(
            f"optimizer='{config.optimizer}', activations='{config.activations}' need at least one "
            f"NVMe drive, and machine {machine.name!r} has none (add one with --nvme N)"
        )
    if drives == 0 and config.spills_grads:
        raise ValueError(
            f"held_grads='nvme' needs at least one NVMe drive, and machine {machine.name!r} has "
            "none (add one with --nvme N, or hold them in RAM: --held-grads ram)"
        )
    terms = Terms()
    if config.schedule == "sliding":
        _sliding_terms(terms, model, config, resident, streamed, drives)
    elif config.schedule == "zero-offload":
        _zero_offload_terms(terms, model, config, drives)
    else:
        resident = resident_preference(model)
        _gpu_only_terms(terms, model, config, drives)
    if config.schedule != "sliding":
        streamed = ()
    return Ledger(
        schedule=config.schedule,
        terms=tuple(terms.items),
        gpu_capacity=gpu_capacity(machine, config),
        cpu_capacity=int(machine.ram_bytes * (1.0 - config.host_margin)),
        nvme_capacity=sum(d.capacity_bytes for d in machine.nvme),
        resident=tuple(sorted(resident)),
        streamed=tuple(sorted(streamed)),
    )


def gpu_capacity(machine: Machine, config: TrainConfig) -> int:
    """The GPU memory a plan may use: the GPU's, or less with `gpu_memory_gb`."""
    own = machine.gpu.memory_bytes
    if config.gpu_memory_gb is None:
        return int(own)
    return int(min(own, config.gpu_memory_gb * GIB))


def gpu_budget(machine: Machine, config: TrainConfig) -> float:
    """What "auto" choices may fill: the capacity less `gpu_margin` (allocator slack)."""
    return (1.0 - config.gpu_margin) * gpu_capacity(machine, config)


def _sliding_terms(
    terms: Terms,
    model: ModelSpec,
    config: TrainConfig,
    resident: tuple[int, ...],
    streamed: tuple[int, ...],
    drives: int,
) -> None:
    common_gpu_terms(terms, model, config)
    activation_terms(terms, model, config, drives)
    sliding = [u for u in resident_preference(model) if u not in resident]
    host_updated = [u for u in sliding if u not in streamed]
    tape_terms(terms, model, config)
    _gpu_unit_terms(terms, model, config, sliding, resident, streamed)
    streamed_staging_terms(terms, model, config, streamed)
    handback_terms(terms, config, max((unit_params(model, u) for u in resident), default=0))
    landing_terms(terms, model, config, host_updated, gpu_updated=bool(streamed or resident))
    cast = cast_units(config, host_updated)
    host_weight_terms(terms, model, [u for u in sliding if u not in cast])
    weight_ring_terms(terms, model, config, cast)
    master_staging_terms(terms, model, config, cast, drives)
    held_grad_terms(terms, model, config, host_updated, drives)
    grad_accum_terms(terms, model, config, sliding)
    global_clip_terms(terms, model, config)
    optimizer_terms(terms, model, config, host_updated, drives)
    rollback_terms(terms, model, config, host_updated)
    optimizer_terms(terms, model, config, list(streamed), drives, pinned=True)
    host_terms(terms)


def _gpu_unit_terms(
    terms: Terms,
    model: ModelSpec,
    config: TrainConfig,
    sliding: list[int],
    resident: tuple[int, ...],
    streamed: tuple[int, ...],
) -> None:
    """The sliding units' GPU slots (a cache ring for the decoder layers, a slot each for the
    embedding and the head) and the resident units, whole. Under global clipping a streamed
    layer keeps its cache unit through every step (`post_norm`): a slot more each."""
    n, p, mb = model.num_layers, model.layer_params, config.moment_bytes
    sliding_layers = [u for u in sliding if 1 <= u <= n]
    held = sum(1 for u in streamed if 1 <= u <= n) if config.deferred_updates else 0
    units = min(config.cache_depth + held, len(sliding_layers))
    terms.add(
        "gpu_units",
        Tier.GPU,
        units,
        p * 2 * BF16,
        "cache units (bf16 weights+grads)",
        f"{units} x {p:.4g} params x 4 B",
        role=R.UNIT,
        units=tuple(sliding_layers),
    )
    for group, members in unit_groups(model, [u for u in sliding if u in (0, n + 1)]):
        q = unit_params(model, members[0])
        terms.add(
            f"gpu_{group}",
            Tier.GPU,
            1,
            q * 2 * BF16,
            f"{group} slot (bf16 weights+grads)",
            f"{q:.4g} params x 4 B",
            role=R.UNIT,
            units=tuple(members),
        )
    for group, members in unit_groups(model, list(resident)):
        terms.add_group(f"gpu_resident_{group}", Tier.GPU, members, unit_params(model, members[0]),
                        2 * BF16 + FP32 + mb, "resident layers (weights, grads, master, moments)",
                        role=R.RESIDENT)  # fmt: skip


def _zero_offload_terms(terms: Terms, model: ModelSpec, config: TrainConfig, drives: int) -> None:
    """DeepSpeed ZeRO-2 with CPU offload (`slide_ir.planning.zero_offload`): BF16 weights on the GPU,
    gradients through one reduce bucket (and one slot for a gradient kept whole) into a pinned
    FP32 gradient buffer, master and moments on the host, a pinned BF16 copy for the upload."""
    n_all, big = model.total_params, largest_param(model)
    # a flush casts each parameter's gradient to FP64 (its norm), then to FP32 (the copy down),
    # one parameter at a time on the compute stream, between layers: the workspace serves it
    flush = (big * 8, f", fp64 copy of the largest parameter's gradient = {big * 8 / GIB:.2f} GiB")
    common_gpu_terms(terms, model, config, flush)
    activation_terms(terms, model, config, drives)
    terms.add(
        "gpu_params",
        Tier.GPU,
        1,
        n_all * BF16,
        "bf16 weights",
        f"{n_all:.4g} x 2 B",
        static=True,
        role=R.DEVICE_WEIGHTS,
        units=resident_preference(model),
    )
    _zero_offload_grad_terms(terms, model, config)
    terms.add("gpu_offload_staging", Tier.GPU, 1, big * BF16,
              "offload staging (largest param, bf16)", f"{big:.4g} x 2 B",
              static=True, role=R.ACCOUNTING)  # fmt: skip
    terms.add(
        "pinned_grads",
        Tier.PINNED,
        1,
        n_all * FP32,
        "fp32 gradients (pinned)",
        f"{n_all:.4g} x 4 B",
        static=True,
        role=R.GRAD_LANDING,
        dtype=Dtype.FP32,
        units=resident_preference(model),
    )
    terms.add(
        "pinned_bf16",
        Tier.PINNED,
        1,
        n_all * BF16,
        "bf16 weights (pinned)",
        f"{n_all:.4g} x 2 B",
        static=True,
        role=R.HOST_WEIGHTS,
        units=resident_preference(model),
    )
    terms.add("host_offload_staging", Tier.PINNED, 1, big * BF16,
              "offload staging (pinned)", f"{big:.4g} x 2 B",
              static=True, role=R.ACCOUNTING)  # fmt: skip
    grad_accum_terms(terms, model, config, list(resident_preference(model)))
    optimizer_terms(terms, model, config, list(resident_preference(model)), drives)
    global_clip_terms(terms, model, config)
    host_terms(terms)


def _zero_offload_grad_terms(terms: Terms, model: ModelSpec, config: TrainConfig) -> None:
    """ZeRO-Offload's GPU gradients: the slot for gradients kept whole and the reduce bucket,
    each with the units it holds at their element offsets."""
    bucket = config.reduce_bucket
    whole = whole_slot_elements(model, config)  # before the bucket: the executor pairs there
    # each unit's gradient at its place in the bucket (or the whole slot) it goes down in
    held = {pool: [(u, o) for b in grad_buckets(model, config) if b.pool == pool
                   for u, o in zip(b.units, b.offsets, strict=True)]
            for pool in (WHOLE_POOL, BUCKET_POOL)}  # fmt: skip
    terms.add(WHOLE_POOL, Tier.GPU, 1, whole * BF16, "gradients kept out of the bucket (bf16)",
              f"{whole:.4g} params x 2 B", static=True, role=R.DEVICE_GRADS,
              units=tuple(u for u, _ in held[WHOLE_POOL]),
              offsets=tuple(o for _, o in held[WHOLE_POOL]))  # fmt: skip
    terms.add(BUCKET_POOL, Tier.GPU, 1, bucket * BF16, "gradient reduce bucket (bf16)",
              f"reduce_bucket {bucket:.4g} x 2 B", static=True, role=R.DEVICE_GRADS,
              units=tuple(u for u, _ in held[BUCKET_POOL]),
              offsets=tuple(o for _, o in held[BUCKET_POOL]))  # fmt: skip


def _gpu_only_terms(terms: Terms, model: ModelSpec, config: TrainConfig, drives: int) -> None:
    """Everything on the GPU: 2+2+4+8 = 16 B per parameter plus activations (no offload)."""
    n_all, per = model.total_params, 2 * BF16 + FP32 + config.moment_bytes
    common_gpu_terms(terms, model, config)
    activation_terms(terms, model, config, drives)
    terms.add(
        "gpu_state",
        Tier.GPU,
        1,
        n_all * per,
        "weights, grads, master, moments",
        f"{n_all:.4g} params x {per} B",
        static=True,
        role=R.RESIDENT,
        units=resident_preference(model),
    )
    handback_terms(terms, config, max(unit_params(model, u) for u in resident_preference(model)))
    global_clip_terms(terms, model, config)
    host_terms(terms)


# -- data-parallel baselines -----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StateBytes:
    """Bytes per parameter of each training state (mixed precision with FP32 master + Adam)."""

    weights: int = BF16
    grads: int = FP32
    master: int = FP32
    moments: int = 2 * FP32

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.moments


def zero_bytes_per_gpu(
    params: int, stage: int, replicas: int, sizes: StateBytes = StateBytes()
) -> int:
    """Model-state bytes per GPU under ZeRO stage 0-3 over `replicas` data-parallel GPUs
    (Rajbhandari et al. 2020): stage 1 shards the optimizer states (master + moments), stage 2
    also the gradients, stage 3 also the weights. With the default sizes (2+4+4+8 = 18 B):
    M0 = 18P, M1 = 6P + 12P/D, M2 = 2P + 16P/D, M3 = 18P/D. Activations are not included."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    opt = sizes.master + sizes.moments
    sharded = {0: 0, 1: opt, 2: opt + sizes.grads, 3: sizes.total}[stage]
    return (sizes.total - sharded) * params + -(-sharded * params // replicas)
