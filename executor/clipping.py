"""Global-norm clipping's two ops: `GRAD_NORM` (one unit's per-parameter norms) and `NORM` (the
step's scale), computed as `torch.nn.utils.clip_grad_norm_` computes them.

torch takes each parameter's L2 norm, then the norm of those norms in the model's parameter
order, and scales every gradient by min(1, max_norm / (norm + 1e-6)). Here each unit's norms
are taken where its step's gradient is whole and written, in Hugging Face parameter order,
into the unit's slot of the norms pool; `NORM` stacks every unit's in unit order (the model's
order: embedding, layers, final norm, LM head) and writes [scale, norm] for the updates. A
data-parallel rank holds a shard of each gradient: its parts' squared norms are summed over the
ranks before the root. A step whose norm is not finite is skipped by every update (`skipped`).
"""

from __future__ import annotations

import torch

from executor.adam import CLIP_EPS, fp32_norm
from executor.env import Env, LaneState
from executor.layout import Entry, UnitLayout
from slide_ir.ir.graph import Op, PoolRole

R = PoolRole
# the parameters of a decoder layer in the order transformers registers them
_LAYER_ORDER = tuple(
    f"{module}.{param}"
    for module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
                   "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
    for param in ("weight", "bias")
)  # fmt: skip
_HEAD_ORDER = ("model.norm.weight", "lm_head.weight")


def hf_order(layout: UnitLayout) -> tuple[Entry, ...]:
    """The unit's parameters in the order `model.parameters()` yields them."""

    def rank(e: Entry) -> int:
        if e.name in _HEAD_ORDER:
            return _HEAD_ORDER.index(e.name)
        tail = e.name.split(".", 3)[-1] if e.name.startswith("model.layers.") else e.name
        return _LAYER_ORDER.index(tail) if tail in _LAYER_ORDER else 0

    return tuple(sorted(layout.hf, key=rank))


def grad_norm(env: Env, lane: LaneState, op: Op) -> None:
    """The unit's gradient norms, per parameter, into its slot of the norms pool."""
    u, shard = op.unit, env.shards[op.unit]
    grad = _gradient(env, op)
    for acc in (v for v in op.reads if env.buffers.roles[v.slot] == R.GRAD_ACCUM):
        grad = env.buffers.of(acc, u).add_(grad)
    norms = param_norms(grad, env.layouts[u], shard.start, shard.end)
    (out,) = (v for v in op.writes if env.buffers.roles[v.slot] == R.GRAD_NORMS)
    dst = env.buffers.of(out, u)
    if len(norms) > dst.numel():
        raise ValueError(f"unit {u} has {len(norms)} parameters, its norms slot {dst.numel()}")
    dst[: len(norms)].copy_(norms, non_blocking=env.cuda)


def param_norms(grad: torch.Tensor, layout: UnitLayout, start: int, end: int) -> torch.Tensor:
    """FP32 L2 norms of each parameter's part inside elements [start, end) of the unit, whose
    gradient there is `grad`, in `hf_order` (`adam.fp32_norm`)."""
    parts = []
    for e in hf_order(layout):
        lo, hi = max(e.offset, start), min(e.offset + e.numel, end)
        part = grad[lo - start : hi - start] if hi > lo else grad[:0]
        parts.append(fp32_norm(part))
    return torch.stack(parts)


def clip_scale(per_param: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, global norm) from every parameter's norm, as `clip_grad_norm_` has them."""
    total = torch.linalg.vector_norm(per_param)
    return (max_norm / (total + CLIP_EPS)).clamp(max=1.0), total


def _gradient(env: Env, op: Op) -> torch.Tensor:
    """The rank's shard of the unit's gradient: landed on the host, or on the GPU."""
    u = op.unit
    g = op.reads[0]
    if env.buffers.roles[g.slot] == R.GRAD_LANDING:
        return env.buffers.of(g, u)[: env.shards[u].numel]
    shard = env.shards[u]
    return env.buffers.unit_at(g, u).g[shard.start : shard.end]


def norm(env: Env, lane: LaneState, op: Op) -> None:
    """[scale, global norm] of the step into the scale slot; a non-finite norm skips it."""
    norms = [
        env.buffers.of(v, op.unit)[: len(env.layouts[u].hf)]
        for u, v in zip(sorted(env.layouts), op.reads, strict=True)
    ]
    per_param = torch.cat(norms)
    if env.ranks is not None:  # a shard's parts: the squares summed over the ranks
        per_param = env.ranks.sum_(per_param.square(), lane.lane).sqrt()
    scale, total = clip_scale(per_param, env.global_clip_norm)
    env.buffers.of(op.writes[0], op.unit).copy_(torch.stack([scale, total]))
    step = env.step_offset + op.step
    env.grad_norms[step] = float(total)
    if not (torch.isfinite(total) and float(scale) == 1.0):
        env.clipped.add(step)
    if not torch.isfinite(total):
        env.skipped.add(step)
