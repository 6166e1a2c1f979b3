"""DeepSpeed ZeRO-2 with CPU offload on one GPU, as DeepSpeed runs it: the gradient buckets.

What DeepSpeed does (deepspeed/runtime/zero/stage_1_and_2.py, read 2026-12; defaults of its
config: reduce_bucket_size 5e8 elements, contiguous_gradients on, overlap_comm off for stage 2,
offload pin_memory on):
- BF16 weights stay whole on the GPU; gradients do not. A hook per parameter copies each
  gradient, as the backward produces it, into one contiguous reduce bucket of
  `reduce_bucket_size` elements (BF16, allocated whole, whatever the model's size). When the
  next gradient would overflow it, the bucket is flushed: per parameter, the gradient's norm
  (computed on an FP64 copy), an FP32 copy, and a copy of that into the pinned FP32 gradient
  buffer on the host: 4 bytes per parameter over the link. Without overlap_comm all of it runs
  on the compute stream, so the backward waits for each flush.
- A parameter larger than the bucket is flushed alone from its own gradient tensor.
- After the backward: CPU Adam over the whole FP32 partition, then a CPU cast of the FP32
  master into a pinned BF16 buffer, then one upload of it into the GPU weights. Nothing of the
  update overlaps the backward or the next forward.
- With cpu offload it also allocates a BF16 buffer of the largest parameter on the GPU and one
  on the host (used for gradient accumulation across micro-batches).

Modelled at unit granularity (0 embedding, 1..n decoder layers, n+1 head): a bucket holds whole
units; a unit goes down with its bucket once the bucket's last unit's gradient is complete.
Units kept out of buckets ("whole"): those larger than the bucket, and a tied embedding (its
gradient is written at the loss and completed by its own backward; autograd holds it between).
"""

from __future__ import annotations

from dataclasses import dataclass

from slide_ir.planning.units import unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

BUCKET_POOL = "gpu_grad_bucket"
WHOLE_POOL = "gpu_grads_whole"


@dataclass(frozen=True, kw_only=True, slots=True)
class GradBucket:
    """One flush: units in the order their gradients complete, where each sits in its slot."""

    units: tuple[int, ...]
    offsets: tuple[int, ...]  # element offset of each unit's gradient in the slot
    pool: str  # BUCKET_POOL, or WHOLE_POOL for a unit kept out of buckets
    elements: int

    @property
    def last(self) -> int:
        return self.units[-1]


def grad_order(model: ModelSpec) -> tuple[int, ...]:
    """Units in the order their gradients complete: the head (at the loss), layers n..1, the
    embedding."""
    n = model.num_layers
    return (n + 1, *range(n, 0, -1), 0)


def unit_elements(model: ModelSpec, unit: int) -> int:

    return unit_params(model, unit)


def kept_whole(model: ModelSpec, config: TrainConfig, unit: int) -> bool:
    """True for a unit whose gradient does not go through a bucket."""
    tied = unit == 0 and model.tied_embeddings
    return tied or unit_elements(model, unit) > config.reduce_bucket


def grad_buckets(model: ModelSpec, config: TrainConfig) -> tuple[GradBucket, ...]:
    """The step's flushes, in order. Empty units (a head of nothing) are skipped."""
    out: list[GradBucket] = []
    units: list[int] = []
    offsets: list[int] = []
    filled = 0

    def close() -> None:
        nonlocal filled
        if units:
            out.append(GradBucket(units=tuple(units), offsets=tuple(offsets), pool=BUCKET_POOL,
                                  elements=filled))  # fmt: skip
        units.clear()
        offsets.clear()
        filled = 0

    for u in grad_order(model):
        p = unit_elements(model, u)
        if p == 0:
            continue
        if kept_whole(model, config, u):
            close()  # DeepSpeed flushes the open bucket before an oversize parameter
            out.append(GradBucket(units=(u,), offsets=(0,), pool=WHOLE_POOL, elements=p))
            continue
        if filled + p > config.reduce_bucket:
            close()
        units.append(u)
        offsets.append(filled)
        filled += p
    close()
    return tuple(out)


def whole_slot_elements(model: ModelSpec, config: TrainConfig) -> int:
    """The one slot for gradients kept whole: at most one is held at a time (an untied head is
    flushed right after the loss; the embedding's is written only at the end of the step, or
    from the loss on when tied, and then the head is only the final norm)."""
    sizes = [b.elements for b in grad_buckets(model, config) if b.pool == WHOLE_POOL]
    return max(sizes, default=0)


def largest_param(model: ModelSpec) -> int:
    """Elements of the model's largest single parameter tensor (DeepSpeed sizes its offload
    staging buffers by it)."""
    h = model.hidden_size
    inner = max(model.intermediate_size, model.moe_intermediate_size, model.q_dim)
    return max(model.embedding_params, model.lm_head_params, h * inner)
