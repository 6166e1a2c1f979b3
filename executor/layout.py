"""Unit layouts: where each parameter of a unit lives inside its one flat buffer.

A unit (0 embedding, 1..n decoder layers, n+1 head) is stored as one flat tensor wherever it
goes (GPU cache-unit slot, pinned BF16 copy, FP32 master, moments, gradient landing), so a slot
holds any unit of its group and a transfer is one copy. Invariants:

- *segments* are the tensors the layer functions take (q, k and v weights fused into one
  `qkv.w` (q_dim + 2 kv_dim, H); gate and up into `gate_up.w` (2 I, H)): one matmul each;
- segments with weight decay (2-D matrices) come first, then the no-decay ones (biases, norms),
  so AdamW updates two contiguous ranges: `[0, decay_numel)` and `[decay_numel, numel)`;
- every Hugging Face parameter name maps to a contiguous range inside one segment, so state
  dicts (transformers names) load and save without knowing the fusion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from slide_ir.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """A named range of the flat buffer with the shape to view it as."""

    name: str
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def view(self, flat: torch.Tensor) -> torch.Tensor:
        return flat[self.offset : self.offset + self.numel].view(self.shape)


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitLayout:
    """Segments (what the layer code uses) and HF names (what state dicts use) of one unit."""

    unit: int
    segments: tuple[Entry, ...]
    hf: tuple[Entry, ...]
    decay_numel: int  # elements [0, decay_numel) get weight decay

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.segments)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Segment name -> view into `flat` (no copy)."""
        return {s.name: s.view(flat) for s in self.segments}

    def hf_views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {e.name: e.view(flat) for e in self.hf}

    def decay_ranges(self) -> tuple[tuple[int, int, bool], ...]:
        """(start, end, decay) for the two contiguous AdamW groups (empty ones dropped)."""
        ranges = ((0, self.decay_numel, True), (self.decay_numel, self.numel, False))
        return tuple(r for r in ranges if r[1] > r[0])


@dataclass(frozen=True, kw_only=True, slots=True)
class Shard:
    """The elements [start, end) of a unit that one rank updates (all of it on one rank): its
    host state, gradient landing and BF16 copy hold just these, indexed from 0."""

    unit: int
    start: int
    end: int
    decay_end: int  # elements [0, decay_end) of the shard get weight decay

    @property
    def numel(self) -> int:
        return self.end - self.start

    def decay_ranges(self) -> tuple[tuple[int, int, bool], ...]:
        """(start, end, decay) of the AdamW groups within the shard (empty ones dropped)."""
        ranges = ((0, self.decay_end, True), (self.decay_end, self.numel, False))
        return tuple(r for r in ranges if r[1] > r[0])


def shard_of(layout: UnitLayout, start: int, end: int) -> Shard:
    decay_end = min(max(layout.decay_numel - start, 0), end - start)
    return Shard(unit=layout.unit, start=start, end=end, decay_end=decay_end)


class _Builder:
    """Appends segments, then lays out HF names inside them."""

    def __init__(self, unit: int) -> None:
        self.unit, self.offset = unit, 0
        self.segments: list[Entry] = []
        self.hf: list[Entry] = []

    def segment(self, name: str, shape: tuple[int, ...], parts: list[tuple[str, int]]) -> None:
        """A segment of `shape` whose leading dim is split into HF tensors `parts` (name, rows)."""
        self.segments.append(Entry(name=name, offset=self.offset, shape=shape))
        inner = math.prod(shape[1:])
        for hf_name, rows in parts:
            self.hf.append(Entry(name=hf_name, offset=self.offset, shape=(rows, *shape[1:])))
            self.offset += rows * inner

    def build(self, decay_numel: int) -> UnitLayout:
        return UnitLayout(
            unit=self.unit,
            segments=tuple(self.segments),
            hf=tuple(self.hf),
            decay_numel=decay_numel,
        )


def layer_layout(spec: ModelSpec, unit: int) -> UnitLayout:
    """Decoder layer `unit` (1-based) = transformers' `model.layers.{unit - 1}`."""
    h, i, q, kv, hd = (
        spec.hidden_size,
        spec.intermediate_size,
        spec.q_dim,
        spec.kv_dim,
        spec.head_dim,
    )
    pre = f"model.layers.{unit - 1}."
    att, mlp = pre + "self_attn.", pre + "mlp."
    b = _Builder(unit)
    qkv = [(att + "q_proj.", q), (att + "k_proj.", kv), (att + "v_proj.", kv)]
    b.segment("qkv.w", (q + 2 * kv, h), [(n + "weight", r) for n, r in qkv])
    b.segment("o.w", (h, q), [(att + "o_proj.weight", h)])
    gate_up = [(mlp + "gate_proj.", i), (mlp + "up_proj.", i)]
    b.segment("gate_up.w", (2 * i, h), [(n + "weight", r) for n, r in gate_up])
    b.segment("down.w", (h, i), [(mlp + "down_proj.weight", h)])
    decay = b.offset
    if spec.attention_bias:
        b.segment("qkv.b", (q + 2 * kv,), [(n + "bias", r) for n, r in qkv])
    if spec.o_proj_bias:
        b.segment("o.b", (h,), [(att + "o_proj.bias", h)])
    if spec.mlp_bias:
        b.segment("gate_up.b", (2 * i,), [(n + "bias", r) for n, r in gate_up])
        b.segment("down.b", (h,), [(mlp + "down_proj.bias", h)])
    b.segment("ln1", (h,), [(pre + "input_layernorm.weight", h)])
    b.segment("ln2", (h,), [(pre + "post_attention_layernorm.weight", h)])
    if spec.qk_norm:
        b.segment("q_norm", (hd,), [(att + "q_norm.weight", hd)])
        b.segment("k_norm", (hd,), [(att + "k_norm.weight", hd)])
    return b.build(decay)


def embed_layout(spec: ModelSpec) -> UnitLayout:
    b = _Builder(0)
    v, h = spec.vocab_size, spec.hidden_size
    b.segment("embed.w", (v, h), [("model.embed_tokens.weight", v)])
    return b.build(b.offset)


def head_layout(spec: ModelSpec) -> UnitLayout:
    """Final norm, plus the LM head when untied (tied: the LOSS op reads the embedding)."""
    b = _Builder(spec.num_layers + 1)
    v, h = spec.vocab_size, spec.hidden_size
    if not spec.tied_embeddings:
        b.segment("lm.w", (v, h), [("lm_head.weight", v)])
    decay = b.offset
    b.segment("norm", (h,), [("model.norm.weight", h)])
    return b.build(decay)


def unit_layouts(spec: ModelSpec) -> dict[int, UnitLayout]:
    """Layouts of every unit, 0..n+1. Decoder layers share one shape (any slot holds any)."""
    out = {0: embed_layout(spec), spec.num_layers + 1: head_layout(spec)}
    for unit in range(1, spec.num_layers + 1):
        out[unit] = layer_layout(spec, unit)
    return dict(sorted(out.items()))
