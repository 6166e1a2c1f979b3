"""Weights in and out, in Hugging Face format, keyed by transformers' own parameter names.

- `initial_weights(model_dir_or_spec, seed)`: a lazy Mapping name -> FP32 tensor: from the
  directory's safetensors when present, else a seeded random init (transformers' Llama-family
  convention: normal(0, initializer_range) for matrices, ones for norms, zeros for biases), one
  tensor at a time so a 70B model never needs two FP32 copies in RAM.
- `write_hf_model(dir, spec, state)`: config.json + safetensors (sharded above 4 GB), fsynced;
  `write_safetensors` streams each tensor from its own memory (no second copy of the state, which
  an 8B model's 96 GB of FP32 master and moments could not afford). `save_checkpoint` writes them
  to a temporary directory and swaps it in, so an interrupted save leaves the old one whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open

from executor import knobs as knobs_mod
from slide_ir.specs.model import ModelSpec

SHARD_BYTES = 4 << 30
INITIALIZER_RANGE = 0.02
SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
}


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or does not match the model; names the file."""


class WriteCancelled(Exception):
    """A checkpoint write stopped by its `cancel` event (the run is being aborted)."""


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
        return self.fill(name, torch.empty(self.shape_of(name)))

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name not in self._names:
            raise KeyError(name)
        return tuple(param_shape(self.spec, name))

    def fill(self, name: str, out: torch.Tensor) -> torch.Tensor:
        """Write tensor `name` into `out` (contiguous, its shape, any float dtype)."""
        if tuple(out.shape) != self.shape_of(name):
            raise ValueError(f"{name}: out has shape {tuple(out.shape)}, not {self.shape_of(name)}")
        if name.endswith("norm.weight"):
            return out.fill_(1.0)
        if name.endswith(".bias"):
            return out.zero_()
        digest = hashlib.sha256(f"{self.seed}:{name}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return out.normal_(0.0, INITIALIZER_RANGE, generator=gen)

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

    def _file(self, name: str) -> Path:
        file = self.dir / self._where[name]
        if not file.is_file():
            raise CheckpointError(f"checkpoint shard {file} is missing (listed for {name})")
        return file

    def header(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype, shape) of a tensor, read from the header only."""
        file = self._file(name)
        try:
            with safe_open(str(file), framework="pt") as f:
                part = f.get_slice(name)
                return part.get_dtype(), tuple(part.get_shape())
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise CheckpointError(f"cannot read {name} from {file}: {exc}") from None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._read(name).float()

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.header(name)[1]

    def fill(self, name: str, out: torch.Tensor) -> torch.Tensor:
        """Copy tensor `name` into `out`, cast to its dtype (no FP32 temporary)."""
        return out.copy_(self._read(name))

    def _read(self, name: str) -> torch.Tensor:
        file = self._file(name)
        try:
            with safe_open(str(file), framework="pt") as f:
                return f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise CheckpointError(f"cannot read {name} from {file}: {exc}") from None

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
) -> Path:
    """Write an HF checkpoint atomically: build it beside `out_dir`, then swap directories."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        write_hf_model(tmp, spec, state, dtype=dtype)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def write_hf_model(
    directory: Path,
    spec: ModelSpec,
    state: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype = torch.bfloat16,
    cancel: threading.Event | None = None,
) -> list[str]:
    """config.json and the weights into an existing directory, every file fsynced. Returns the
    names of the files written (what `from_pretrained` reads)."""
    write_text(directory / "config.json", json.dumps(config_saying(spec, dtype), indent=2))
    shards: list[list[str]] = [[]]
    size = 0
    for name in param_names(spec):
        nbytes = meta_of(state, name).numel() * dtype.itemsize
        if size and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes

    def write(path: Path, names: list[str]) -> None:
        metas = [(n, meta_of(state, n).to(dtype)) for n in names]
        _write_safetensors(path, metas, lambda n: state[n].detach().to("cpu", dtype), cancel)

    if len(shards) == 1:
        write(directory / "model.safetensors", shards[0])
        return ["config.json", "model.safetensors"]
    weight_map = {}
    files = [f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)]
    for file, names in zip(files, shards, strict=True):
        write(directory / file, names)
        weight_map |= dict.fromkeys(names, file)
    total = sum(meta_of(state, n).numel() for n in weight_map) * dtype.itemsize
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    write_text(directory / "model.safetensors.index.json", json.dumps(index, indent=2))
    return ["config.json", "model.safetensors.index.json", *files]


def config_saying(spec: ModelSpec, dtype: torch.dtype) -> dict[str, object]:
    """The model's HF config with its dtype keys naming the dtype written: an input's
    `"dtype": "bfloat16"` beside FP32 weights would make `from_pretrained(..., dtype="auto")`
    load them as BF16 and tell the reader something the files do not hold."""
    config = spec.to_hf_config()
    written = str(dtype).removeprefix("torch.")
    config["dtype"] = written
    if "torch_dtype" in config:  # the key before transformers 4.56, still read
        config["torch_dtype"] = written
    return config


def write_safetensors(
    path: Path,
    tensors: Mapping[str, torch.Tensor] | Iterator[tuple[str, torch.Tensor]],
    *,
    cancel: threading.Event | None = None,
) -> None:
    """A safetensors file written tensor by tensor, then fsynced. The header needs every shape
    first: from `meta_of` for a mapping (a `StateView` reads each tensor only when its turn
    comes, so the file never holds more than one unit in RAM), from the tensors themselves for
    pairs. `cancel` set: WriteCancelled before the next tensor (a background write stops
    within one tensor's time when the run is aborted)."""
    if isinstance(tensors, Mapping):
        metas = [(n, meta_of(tensors, n)) for n in tensors]
        _write_safetensors(path, metas, tensors.__getitem__, cancel)
        return
    pairs = dict(tensors)
    _write_safetensors(path, list(pairs.items()), pairs.__getitem__, cancel)


def meta_of(tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    """The dtype and shape of `tensors[name]` as a tensor with no data (read from nothing where
    the mapping can say, as a `StateView` does)."""
    meta = getattr(tensors, "meta", None)
    if meta is not None:
        return meta(name)  # type: ignore[no-any-return]
    t = tensors[name]
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _write_safetensors(
    path: Path,
    metas: list[tuple[str, torch.Tensor]],
    fetch: Callable[[str], torch.Tensor],
    cancel: threading.Event | None,
) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in metas:
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.numel() * t.element_size()],
        }
        offset += t.numel() * t.element_size()
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    delay_ms = knobs_mod.from_env().save_delay_ms
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for name, want in metas:
            if delay_ms:
                time.sleep(delay_ms / 1e3)
            if cancel is not None and cancel.is_set():
                raise WriteCancelled(str(path))
            t = fetch(name)
            if t.dtype != want.dtype or t.shape != want.shape:
                raise ValueError(f"{path}: {name} is {t.dtype} {tuple(t.shape)}, its header "
                                 f"says {want.dtype} {tuple(want.shape)}")  # fmt: skip
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())


def write_text(path: Path, text: str) -> None:
    delay_ms = knobs_mod.from_env().save_delay_ms
    with open(path, "w", encoding="utf-8") as f:
        if delay_ms:
            time.sleep(delay_ms / 1e3)
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _swap_in(tmp: Path, out: Path) -> None:
    """Replace `out` by `tmp`; the old directory is removed only once the new one is in place."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
