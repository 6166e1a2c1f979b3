"""Weights in and out, in Hugging Face format, keyed by transformers' own parameter names.

- `initial_weights(model_dir_or_spec, seed)`: a lazy Mapping name -> FP32 tensor: from the
  directory's safetensors when present, else a seeded random init (transformers' Llama-family
  convention: normal(0, initializer_range) for matrices, ones for norms, zeros for biases), one
  tensor at a time so a 70B model never needs two FP32 copies in RAM.
- `save_checkpoint(out_dir, spec, state)`: config.json + safetensors (sharded above 4 GB), written
  to a temporary directory and swapped in, so an interrupted save leaves the old checkpoint whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from slide_ir.model import ModelSpec

SHARD_BYTES = 4 << 30
INITIALIZER_RANGE = 0.02


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or does not match the model; names the file."""


def param_names(spec: ModelSpec) -> list[str]:
    """transformers' parameter names for a Llama-family causal LM, in module order."""
    names = ["model.embed_tokens.weight"]
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        attn = [f"{p}self_attn.{x}_proj.weight" for x in "qkvo"]
        if spec.attention_bias:
            attn += [f"{p}self_attn.{x}_proj.bias" for x in "qkv"]
            if spec.o_proj_bias:
                attn.append(f"{p}self_attn.o_proj.bias")
        if spec.qk_norm:
            attn += [f"{p}self_attn.q_norm.weight", f"{p}self_attn.k_norm.weight"]
        mlp = [f"{p}mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        if spec.mlp_bias:
            mlp += [f"{p}mlp.{x}_proj.bias" for x in ("gate", "up", "down")]
        names += attn + mlp + [f"{p}input_layernorm.weight", f"{p}post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not spec.tied_embeddings:
        names.append("lm_head.weight")
    return names


def param_shape(spec: ModelSpec, name: str) -> tuple[int, ...]:
    h, kv, q = spec.hidden_size, spec.kv_dim, spec.q_dim
    leaf = name.rsplit(".", 2)[-2:]
    part, kind = leaf[0], leaf[1]
    if part in ("embed_tokens", "lm_head"):
        return (spec.vocab_size, h)
    if part in ("input_layernorm", "post_attention_layernorm", "norm"):
        return (h,)
    if part in ("q_norm", "k_norm"):
        return (spec.head_dim,)
    out_in = {
        "q_proj": (q, h),
        "k_proj": (kv, h),
        "v_proj": (kv, h),
        "o_proj": (h, q),
        "gate_proj": (spec.intermediate_size, h),
        "up_proj": (spec.intermediate_size, h),
        "down_proj": (h, spec.intermediate_size),
    }[part]
    return out_in if kind == "weight" else out_in[:1]


class RandomInit(Mapping[str, torch.Tensor]):
    """Seeded random weights made on demand: the same name and seed give the same tensor."""

    def __init__(self, spec: ModelSpec, seed: int) -> None:
        self.spec, self.seed, self._names = spec, seed, param_names(spec)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        shape = param_shape(self.spec, name)
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        if name.endswith(".bias"):
            return torch.zeros(shape)
        digest = hashlib.sha256(f"{self.seed}:{name}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return torch.empty(shape).normal_(0.0, INITIALIZER_RANGE, generator=gen)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class SafetensorsWeights(Mapping[str, torch.Tensor]):
    """Tensors read lazily from a checkpoint directory (single file or sharded with an index)."""

    def __init__(self, model_dir: Path) -> None:
        self.dir = model_dir
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                self._where = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise CheckpointError(f"{index} is not a safetensors index: {exc}") from None
        else:
            self._where = {
                k: "model.safetensors" for k in self._keys(model_dir / "model.safetensors")
            }

    @classmethod
    def single(cls, file: Path) -> SafetensorsWeights:
        """Tensors of one safetensors file that is not a model's (e.g. optimizer moments)."""
        out = cls.__new__(cls)
        out.dir = file.parent
        out._where = dict.fromkeys(out._keys(file), file.name)
        return out

    def _keys(self, file: Path) -> list[str]:
        try:
            with safe_open(str(file), framework="pt") as f:
                return list(f.keys())
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"cannot read {file}: {exc}") from None

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self.dir / self._where[name]
        if not file.is_file():
            raise CheckpointError(f"checkpoint shard {file} is missing (listed for {name})")
        with safe_open(str(file), framework="pt") as f:
            return f.get_tensor(name).float()

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def has_weights(model_dir: Path) -> bool:
    return any(
        (model_dir / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")
    )


def initial_weights(
    spec: ModelSpec, model_dir: str | Path | None, seed: int
) -> Mapping[str, torch.Tensor]:
    """Checkpoint weights when `model_dir` holds them (checked against the spec), else random."""
    if model_dir is None or not has_weights(Path(model_dir)):
        return RandomInit(spec, seed)
    weights = SafetensorsWeights(Path(model_dir))
    expected = param_names(spec)
    missing = [n for n in expected if n not in weights]
    if missing:
        raise CheckpointError(
            f"{model_dir} lacks {len(missing)} tensors the config needs, e.g. {missing[0]}"
        )
    for name in (expected[0], expected[-1]):
        got = tuple(weights[name].shape)
        if got != param_shape(spec, name):
            raise CheckpointError(
                f"{model_dir}: {name} has shape {got}, config says {param_shape(spec, name)}"
            )
    return weights


def save_checkpoint(
    out_dir: str | Path,
    spec: ModelSpec,
    state: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype = torch.bfloat16,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write an HF checkpoint atomically: build it beside `out_dir`, then swap directories."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        (tmp / "config.json").write_text(json.dumps(spec.to_hf_config(), indent=2))
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        _write_shards(tmp, spec, state, dtype)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_shards(
    tmp: Path, spec: ModelSpec, state: Mapping[str, torch.Tensor], dtype: torch.dtype
) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in param_names(spec):
        t = state[name].detach().to("cpu", dtype).contiguous()
        if size and size + t.nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    if len(shards) == 1:
        save_file(shards[0], str(tmp / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(tmp / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, file)
    index = {
        "metadata": {"total_size": sum(t.nbytes for s in shards for t in s.values())},
        "weight_map": weight_map,
    }
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _swap_in(tmp: Path, out: Path) -> None:
    """Replace `out` by `tmp`; the old directory is removed only once the new one is in place."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
