"""The ledger's terms for the training state off the GPU and what the update keeps beside it:
FP32 master and moments (in RAM, pinned for streamed units, or on NVMe with a staging ring), the
GPU staging of streamed updates, FP32 gradient accumulators, global clipping's norms, the
rollback copies of speculated updates, and the final save's hand-back buffer.
"""

from __future__ import annotations

from slide_ir.ir.graph import PoolRole as R
from slide_ir.ir.graph import Tier
from slide_ir.planning.terms import Terms, unit_groups
from slide_ir.planning.units import FP32, resident_preference, unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec


def optimizer_terms(
    terms: Terms,
    model: ModelSpec,
    config: TrainConfig,
    units: list[int],
    drives: int,
    *,
    pinned: bool = False,
) -> None:
    """FP32 master + moments of the units updated from host state: in RAM (pinned for streamed
    units, which the copy engines read), or on NVMe with a staging ring in RAM."""
    mb = config.moment_bytes
    on_nvme = 0 if pinned else {"cpu": 0, "nvme": FP32 + mb, "nvme-moments": mb}[config.optimizer]
    tier, prefix, note = (Tier.PINNED, "pinned_", " (pinned)") if pinned else (Tier.CPU, "", "")
    for group, members in unit_groups(model, units):
        p = unit_params(model, members[0])
        if config.optimizer != "nvme" or pinned:
            terms.add_group(f"{prefix}master_{group}", tier, members, p, FP32,
                            "fp32 master weights" + note, role=R.MASTER)  # fmt: skip
        if not on_nvme:
            terms.add_group(f"{prefix}moments_{group}", tier, members, p, mb,
                            "Adam moments" + note, role=R.MOMENTS)  # fmt: skip
            continue
        terms.add_group(f"nvme_opt_{group}", Tier.NVME, members, p, on_nvme,
                        "optimizer state (NVMe)", role=R.NVME_STATE)  # fmt: skip
    if on_nvme:
        opt_staging_terms(terms, model, units, drives, on_nvme, lean=config.lean_buffers)


def opt_staging_terms(
    terms: Terms, model: ModelSpec, units: list[int], drives: int, on_nvme: int, *, lean: bool
) -> None:
    """RAM the NVMe state stripes are read into for their update. Decoder layers rotate
    through 3 stripes per drive (one read ahead, one updating, one being written). The
    embedding and the head, one unit each, share one stripe per drive the size of the larger:
    their updates come at the two ends of the step's (the head's read waits for the
    embedding's write-back, or the other way round), as their gradients share a landing slot.
    70B: 12.6 GB less RAM. With `lean_buffers` the layers share one too, each read when its
    update is due, after the write-back before it (qwen2.5-14b, moments: 8.4 GB against 12.8)."""
    layer_depth = 1 if lean else 3
    groups = [(g, m, layer_depth if len(m) > 1 else 1) for g, m in unit_groups(model, units)]
    vocab = [m[0] for g, m, _ in groups if g in ("embed", "head")]
    if len(vocab) == 2:
        groups = [(g, m, d) for g, m, d in groups if g == "layers"] + [("vocab", vocab, 1)]
    for group, members, depth in groups:
        p = max(unit_params(model, u) for u in members)
        terms.add(
            f"opt_staging_{group}",
            Tier.CPU,
            depth * drives,
            -(-p * on_nvme // drives),
            "optimizer NVMe staging",
            f"{depth} x {p:.4g} params x {on_nvme} B",
            role=R.OPT_STAGING,
            units=tuple(members),
        )


# global clipping: GPU state slots a group's streamed units take turns in after the norm (one
# coming up while the one before it goes down)
POST_NORM_STATE_SLOTS = 2


def streamed_staging_terms(
    terms: Terms, model: ModelSpec, config: TrainConfig, streamed: tuple[int, ...]
) -> None:
    """The GPU side of streamed updates: per slot one unit's FP32 master and moments, one slot
    per streamed unit: the schedule moves the state when the link is free, so most of the
    step's states are on the GPU at once. Under global clipping the states move after the
    norm, in turn, through `POST_NORM_STATE_SLOTS` slots a group."""
    per = FP32 + config.moment_bytes
    for group, members in unit_groups(model, list(streamed)):
        p = unit_params(model, members[0])
        if not config.deferred_updates:
            terms.add_group(f"gpu_opt_{group}", Tier.GPU, members, p, per,
                            "streamed optimizer state (fp32 master, moments)",
                            role=R.STREAM_STATE, static=False)  # fmt: skip
            continue
        slots = min(len(members), POST_NORM_STATE_SLOTS)
        terms.add(f"gpu_opt_{group}", Tier.GPU, slots, p * per,
                  "streamed optimizer state after the norm (fp32 master, moments)",
                  f"{slots} x {p:.4g} params x {per} B", role=R.STREAM_STATE,
                  units=tuple(members))  # fmt: skip


def grad_accum_terms(terms: Terms, model: ModelSpec, config: TrainConfig, units: list[int]) -> None:
    """FP32 accumulators on the host for the gradients of several micro-batches."""
    if config.grad_accum == 1:
        return
    for group, members in unit_groups(model, units):
        terms.add_group(f"grad_accum_{group}", Tier.CPU, members, unit_params(model, members[0]),
                        FP32, "fp32 gradient accumulators", role=R.GRAD_ACCUM)  # fmt: skip


# the most parameter tensors a unit has (a decoder layer with every bias and q/k norms: 13)
MAX_UNIT_TENSORS = 16


def global_clip_terms(terms: Terms, model: ModelSpec, config: TrainConfig) -> None:
    """Global clipping's norms: each unit's per-parameter gradient norms where its `GRAD_NORM`
    leaves them, and the step's scale and norm that `NORM` writes for the updates."""
    if not config.deferred_updates:
        return
    units = list(resident_preference(model))
    terms.add_group("pinned_grad_norms", Tier.PINNED, units, MAX_UNIT_TENSORS, FP32,
                    "gradient norms per parameter (fp32)", role=R.GRAD_NORMS)  # fmt: skip
    terms.add("pinned_grad_scale", Tier.PINNED, 1, 2 * FP32, "clip scale and global norm",
              "2 x 4 B", static=True, role=R.GRAD_SCALE)  # fmt: skip


def speculated_units(model: ModelSpec, config: TrainConfig, host_updated: list[int]) -> list[int]:
    """The host-updated units whose updates speculate (`TrainConfig.speculate`): the first
    `config.speculated` to land, head first and the embedding last, as the backward lands
    them. Only with the state in RAM (a rollback of NVMe stripes would cost a drive pass)."""
    if config.optimizer != "cpu":
        return []
    landing = [u for u in sorted(host_updated, reverse=True) if unit_params(model, u)]
    return landing[: config.speculated]


def rollback_terms(
    terms: Terms, model: ModelSpec, config: TrainConfig, host_updated: list[int]
) -> None:
    """A speculated unit's master and moments as they were before its update, kept until the
    norm validates it (`slide_ir.planning.speculation`)."""
    units = speculated_units(model, config, host_updated)
    for group, members in unit_groups(model, units):
        terms.add_group(f"rollback_{group}", Tier.CPU, members, unit_params(model, members[0]),
                        FP32 + config.moment_bytes, "state before a speculative update",
                        role=R.ROLLBACK)  # fmt: skip


def handback_terms(terms: Terms, config: TrainConfig, largest_on_gpu: int) -> None:
    """The final save reads the state a unit at a time while the run's buffers still exist
    (`slide train`: `train(on_finish=..., hand_back=False)`): a GPU-kept unit's FP32 master and
    moments pass through host RAM one unit at a time, the largest (an embedding) at most. The
    whole state gathered into RAM, as `train(hand_back=True)` does for an API caller, is not
    planned: it took RSS to 93.0 GiB after an 8B run kept entirely on the H200, whose training
    needed 4 GiB of host RAM, and it is what kept qwen2.5-14b off that 125 GiB host."""
    if largest_on_gpu:
        per = FP32 + config.moment_bytes
        terms.add(
            "host_handback",
            Tier.CPU,
            1,
            largest_on_gpu * per,
            "final save, a GPU-kept unit at a time (fp32 master + moments)",
            f"{largest_on_gpu:.4g} params (the largest GPU-kept unit) x {per} B",
            static=True,
            role=R.ACCOUNTING,
        )
