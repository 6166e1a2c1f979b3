"""The training Slide's executor reproduces, written as a plain PyTorch loop: no schedule, no
lanes, no offloading. Read this first; the parity tests and `bench/kernels/gpu_parity.py` use it as the
oracle the executor is measured against.

One optimizer step:
1. for each of its `grad_accum` micro-batches, the transformers model's forward, the sum of the
   token cross-entropies divided by the step's labelled tokens (so the step's loss is the mean
   over every labelled token of the step, however they split into micro-batches), backward;
   a micro-batch of packed documents (input_ids, labels, positions) runs each document alone,
   as its own sequence from position 0 (positions restart at 0 at each document's first token);
2. optionally, the gradients clipped: all of them by their global L2 norm
   (`clip_grad_norm_` over every parameter: `TrainConfig.clip = "global"`), or each unit's by
   its own (the embedding, one decoder layer, the head: `"per-unit"`); a step whose global
   norm is not finite is skipped under "global";
3. `torch.optim.AdamW` on FP32 master weights (the model's own parameters when it runs in FP32),
   then the model's weights copied from them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

Batches = Sequence[tuple[torch.Tensor, ...]]


def reference_train(
    model: torch.nn.Module,
    batches: Batches,
    *,
    lr: float,
    grad_accum: int = 1,
    weight_decay: float = 0.0,
    clip_norm: float | None = None,
    clip_global: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train `model` (a transformers causal LM) on `batches` of (input_ids, labels), labels
    already shifted, -100 ignored, or of packed documents (input_ids, labels, positions);
    len(batches) / grad_accum steps. Returns each step's loss and the final FP32 weights by
    parameter name, on the CPU."""
    model = model.to(device, dtype)
    params = dict(model.named_parameters())
    master = (
        params
        if dtype == torch.float32
        else {n: p.detach().float().clone().requires_grad_() for n, p in params.items()}
    )
    opt = torch.optim.AdamW(master.values(), lr=lr, weight_decay=weight_decay)
    losses = []
    for start in range(0, len(batches), grad_accum):
        micro = batches[start : start + grad_accum]
        valid = sum(int((batch[1] != -100).sum()) for batch in micro)
        total = 0.0
        for batch in micro:
            for ids, labels in sequences(*batch):
                logits = model(input_ids=ids.to(device)).logits.float().flatten(0, 1)  # (b*s, V)
                loss = torch.nn.functional.cross_entropy(
                    logits, labels.to(device).flatten(), reduction="sum"
                )
                (loss / valid).backward()
                total += float(loss.detach() / valid)
        if master is not params:
            for name, p in params.items():
                master[name].grad = p.grad.float()
                p.grad = None
        skip = False
        if clip_norm is not None and clip_global:
            norm = torch.nn.utils.clip_grad_norm_(list(master.values()), clip_norm)
            skip = not bool(torch.isfinite(norm))
        elif clip_norm is not None:
            for group in units(model, master):
                torch.nn.utils.clip_grad_norm_(group, clip_norm)
        if not skip:
            opt.step()
        opt.zero_grad()
        if master is not params:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(master[name])
        losses.append(total)
    return losses, {n: t.detach().float().cpu().clone() for n, t in master.items()}


def sequences(
    ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What the model runs on: the micro-batch whole, or each packed document alone, (1, n)."""
    if positions is None:
        return [(ids, labels)]
    out = []
    for row in range(ids.shape[0]):
        starts = [*positions[row].eq(0).nonzero().flatten().tolist(), ids.shape[1]]
        for a, b in itertools.pairwise(starts):
            out.append((ids[row : row + 1, a:b], labels[row : row + 1, a:b]))
    return out


def units(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> list[list[torch.Tensor]]:
    """`tensors` (by parameter name) grouped as the executor's units: the embedding (the LM
    head too when tied), each decoder layer, the head (final norm + untied LM head)."""
    layers = len(model.model.layers)  # type: ignore[union-attr]
    groups: list[list[torch.Tensor]] = [[] for _ in range(layers + 2)]
    for name, t in tensors.items():
        if name.startswith("model.embed_tokens."):
            groups[0].append(t)
        elif name.startswith("model.layers."):
            groups[1 + int(name.split(".")[2])].append(t)
        else:  # model.norm, lm_head
            groups[layers + 1].append(t)
    return groups
