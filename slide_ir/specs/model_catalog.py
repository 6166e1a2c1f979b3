"""The built-in model catalog (`catalog/models/<name>.json`) and `load_model`, which finds a
model's config.json by catalog name, HF repo id of a catalog entry, file or model directory.

A name that is none of these raises `UnknownModelError` with the closest catalog names; a file
that cannot be read raises `ModelConfigError` naming it.
"""

from __future__ import annotations

import difflib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from slide_ir.specs.hf_config import ModelConfigError
from slide_ir.specs.model import ModelSpec


class UnknownModelError(ValueError):
    """A name that is neither a catalog entry nor an existing path."""


def _catalog_dir() -> Path:
    return Path(str(resources.files("slide_ir") / "catalog" / "models"))


def model_names() -> list[str]:
    """Names of the built-in catalog entries, sorted (what `slide models` lists)."""
    return sorted(p.stem for p in _catalog_dir().glob("*.json"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}: not valid JSON ({e})") from e
    except OSError as e:
        raise ModelConfigError(f"{path}: cannot read ({e.strerror})") from e


def _catalog_sources() -> dict[str, str]:
    """HF repo id (lower case) -> catalog name, so "meta-llama/Llama-3.1-8B" finds its entry."""
    out: dict[str, str] = {}
    for name in model_names():
        source = _read_json(_catalog_dir() / f"{name}.json").get("_source", "")
        out[str(source).lower()] = name
    return out


def _unknown(name: str) -> UnknownModelError:
    names = model_names()
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return UnknownModelError(
        f"unknown model {name!r}: not a catalog name nor an existing config.json or model "
        f"directory.{hint} Run `slide models` to list the catalog."
    )


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name, an HF repo id of a catalog entry, a config.json, or a directory holding one."""
    catalog = _catalog_dir() / f"{name_or_path.lower()}.json"
    if "/" not in name_or_path and catalog.is_file():
        return ModelSpec.from_hf_config(
            _read_json(catalog), name=name_or_path.lower(), origin=str(catalog)
        )
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelConfigError(f"{path}: no config.json in this model directory")
    if path.is_file():
        name = path.parent.name if path.name == "config.json" else path.stem
        return ModelSpec.from_hf_config(_read_json(path), name=name or path.stem, origin=str(path))
    alias = _catalog_sources().get(name_or_path.lower())
    if alias is not None:
        return load_model(alias)
    raise _unknown(name_or_path)
