"""The units of a plan and the bytes per parameter of what they hold.

Units of the sliding schedule ("layers" in op ids): 0 = embedding, 1..n = decoder layers,
n+1 = head (final norm + untied LM head). Every memory term, cost and schedule counts in them, so
their sizes live here, below the ledger and the emitters that both need them.
"""

from __future__ import annotations

from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

GIB = 1 << 30
BF16 = 2
FP32 = 4


def unit_params(model: ModelSpec, unit: int) -> int:
    """Parameters of a unit: the embedding, one decoder layer, or the head stage."""
    if unit == 0:
        return model.embedding_params
    if unit == model.num_layers + 1:
        return model.final_norm_params + model.lm_head_params
    return model.layer_params


def resident_preference(model: ModelSpec) -> tuple[int, ...]:
    """Order in which units become resident: the embedding first (its CPU update would sit at
    the step boundary, where nothing hides it), then the decoder layers whose backward comes
    last (1, 2, ...: their updates also end the step), the head last."""
    return (0, *range(1, model.num_layers + 1), model.num_layers + 1)


def adam_bytes_per_param(config: TrainConfig, *, weight_copy: bool = True) -> int:
    """Bytes one CPU AdamW step touches per parameter: FP32 master read+write, both moments read
    + write, the BF16 gradient read (twice with per-unit clipping: its norm comes first; global
    clipping's norm is its own op, `GRAD_NORM`), and the fused BF16 weight write (`weight_copy`:
    a unit whose upload is cast from the master has no copy to write)."""
    clip_read = BF16 if config.clip == "per-unit" else 0
    copy = BF16 if weight_copy else 0
    return 2 * FP32 + 2 * config.moment_bytes + BF16 + copy + clip_read
