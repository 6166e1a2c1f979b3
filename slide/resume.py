"""What a checkpoint's `slide_state.json` records, and the rules `--resume` enforces with it.

A resumed run continues exactly the run that was saved: the same model, batch shape, optimizer
settings and LR-schedule horizon (`total_steps`). A different `--steps` is refused unless
`--extend-schedule`, which re-plans the schedule over the new horizon from the step reached (a
cosine or linear LR then jumps to its value at that step of the longer schedule). Every file is
checked (names, shapes, dtypes, JSON fields) before the model is built, and each problem is
reported as one line naming the file.

What a run was started with is recorded too (model, data, tokenizer, seed, shuffle, packing,
batch shape, optimizer, clipping), so a resume takes each value whose flag is left out from the
checkpoint (`recorded_flags`) instead of from the flag's default, and the checks above meet only the
values a user typed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from executor.adam import AdamWConfig
from executor.state import EXP_AVG, EXP_AVG_SQ
from slide.checkpoints import STATE_FILE, find_checkpoint
from slide.errors import StopRun, UserError
from slide.weights import CheckpointError, SafetensorsWeights, param_names, param_shape
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

OPTIM_FILE = "optimizer.safetensors"
STATE_VERSION = 2
SHAPE_FIELDS = ("batch", "seq", "grad_accum")
OPTIM_FLAGS = {
    "lr": "--lr",
    "schedule": "--lr-schedule",
    "warmup_steps": "--warmup-steps",
    "weight_decay": "--weight-decay",
    "betas": "--betas",
    "eps": "--eps",
}
FLOAT_DTYPES = ("F32", "BF16", "F16")


@dataclass(frozen=True, kw_only=True)
class Resumed:
    directory: Path
    steps_done: int
    total_steps: int  # the LR schedule's horizon this run continues
    weights: Mapping[str, torch.Tensor]  # read lazily, one tensor at a time
    moments: Mapping[str, torch.Tensor]
    skipped_steps: tuple[int, ...] = ()  # global steps global clipping skipped (no update made)


# config fields a resume takes from the checkpoint, by their flag's argparse destination (the
# placement fields are not among them: a resume may place the same run differently)
CONFIG_DESTS = {"batch": "batch", "seq": "seq", "grad_accum": "grad_accum", "clip": "clip",
                "clip_norm": "clip_norm", "moments_dtype": "moments"}  # fmt: skip
# run inputs recorded beside them, by destination: what --model, --data, --tokenizer, --seed
# --eval-fraction (the windows training never draws) and --packing named, and whether
# --no-shuffle was given
INPUT_DESTS = {"model_source": "model", "data": "data", "tokenizer": "tokenizer", "seed": "seed",
               "eval_fraction": "eval_fraction", "packing": "packing"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """A checkpoint's run as its command line gave it, read without opening any tensor."""

    directory: Path
    steps_done: int
    flags: dict[str, object]  # argparse destination -> value; what an older state lacks is absent


def state_json(
    *,
    spec: ModelSpec,
    config: TrainConfig,
    optim: AdamWConfig,
    steps_done: int,
    seed: int,
    data: str | None,
    model_source: str,
    tokenizer: str | None,
    shuffle: bool,
    packing: str,
    eval_fraction: float | None = None,
    skipped_steps: Sequence[int] = (),
) -> str:
    """`model_source` is what --model named (a catalog name or a directory); paths are stored
    absolute, so a resume from another directory finds them. `skipped_steps`: the steps up to
    `steps_done` that global clipping skipped, which Adam's bias correction leaves out."""
    recorded = {k: v for k, v in asdict(optim).items() if k != "total_steps"}
    model_dir = Path(model_source).is_dir()
    state = {
        "version": STATE_VERSION,
        "steps_done": steps_done,
        "skipped_steps": sorted(skipped_steps),
        "total_steps": optim.total_steps,
        "model": spec.to_hf_config(),
        "config": asdict(config),
        "optim": recorded,
        "seed": seed,
        "data": _absolute(data),
        "model_source": _absolute(model_source) if model_dir else model_source,
        "tokenizer": _absolute(tokenizer),
        "shuffle": shuffle,
        "eval_fraction": eval_fraction,  # the windows held out of training (`slide.eval_data`)
        "packing": packing,
    }
    return json.dumps(state, indent=2)


def _absolute(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def recorded_flags(path: str) -> Recorded:
    """The checkpoint `--resume path` continues, and its run's values by flag destination."""
    ckpt = find_checkpoint(path)
    state = _read_state(ckpt / STATE_FILE)
    config, optim = state["config"], state.get("optim") or {}
    flags: dict[str, object] = {d: config[k] for k, d in CONFIG_DESTS.items() if k in config}
    flags |= {d: state[k] for k, d in INPUT_DESTS.items() if k in state}
    flags |= {_dest(flag): optim[k] for k, flag in OPTIM_FLAGS.items() if k in optim}
    if "betas" in optim:  # the flag's text form
        flags["betas"] = ",".join(map(str, optim["betas"]))
    if "shuffle" in state:
        flags["no_shuffle"] = not state["shuffle"]
    if state.get("total_steps"):  # a resume finishes the run's schedule unless --steps says
        flags["steps"] = state["total_steps"]
    return Recorded(directory=ckpt, steps_done=state["steps_done"], flags=flags)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def read_checkpoint(
    path: str,
    spec: ModelSpec,
    config: TrainConfig,
    optim: AdamWConfig,
    *,
    extend_schedule: bool,
) -> Resumed:
    """The checkpoint `--resume path` continues, checked against this run's request."""
    ckpt = find_checkpoint(path)
    state = _read_state(ckpt / STATE_FILE)
    _check_same_run(ckpt, state, spec, config, optim)
    done, steps = state["steps_done"], config.steps
    horizon = state.get("total_steps") or steps
    if steps <= done:
        raise StopRun(
            f"nothing to do: {ckpt} has done {done} steps and --steps is {steps} (ask for more "
            "steps, with --extend-schedule, to train further)",
            code=0,
        )
    if steps != horizon and not extend_schedule:
        raise UserError(
            f"--resume {ckpt}: that run's LR schedule ends at step {horizon}, --steps is "
            f"{steps}: leave --steps out to finish it, or pass --extend-schedule to re-plan the "
            f"schedule over {steps} steps from step {done}"
        )
    weights, moments = _open_tensors(ckpt, spec)
    return Resumed(
        directory=ckpt,
        steps_done=done,
        total_steps=steps if extend_schedule else horizon,
        weights=weights,
        moments=moments,
        skipped_steps=tuple(state.get("skipped_steps", [])),  # an older state's: none recorded
    )


def _read_state(file: Path) -> dict[str, Any]:
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{file} is unreadable: {exc}") from None
    expect = {"steps_done": int, "model": dict, "config": dict}
    bad = [
        k for k, t in expect.items() if not isinstance(state, dict) or type(state.get(k)) is not t
    ]
    if not bad and not all(isinstance(state["config"].get(k), int) for k in SHAPE_FIELDS):
        bad = [f"config.{k}" for k in SHAPE_FIELDS]
    if not bad and state["steps_done"] < 0:
        bad = ["steps_done"]
    skipped = state.get("skipped_steps", []) if not bad else []
    if not isinstance(skipped, list) or not all(
        type(s) is int and 1 <= s <= state["steps_done"] for s in skipped
    ):
        bad = ["skipped_steps"]
    if bad:
        raise CheckpointError(
            f"{file} lacks a valid {', '.join(bad)}: not a {STATE_FILE} written by slide train"
        )
    return state


def _check_same_run(
    ckpt: Path, state: dict[str, Any], spec: ModelSpec, config: TrainConfig, optim: AdamWConfig
) -> None:
    mine = spec.to_hf_config()
    if state["model"] != mine:
        diff = sorted(
            k for k in set(state["model"]) | set(mine) if state["model"].get(k) != mine.get(k)
        )
        raise UserError(f"--resume {ckpt}: the checkpoint's model differs from --model in {diff}")
    diff = [k for k in SHAPE_FIELDS if state["config"][k] != getattr(config, k)]
    if diff:
        was = ", ".join(f"{k}={state['config'][k]}" for k in diff)
        raise UserError(f"--resume {ckpt}: the checkpoint was trained with {was}; leave the "
                        "flag out to continue with it, or pass the same")  # fmt: skip
    recorded = state.get("optim") or {}
    now = asdict(optim)
    for key, flag in OPTIM_FLAGS.items():
        was = recorded.get(key, now[key])
        if (list(was) if key == "betas" else was) != (
            list(now[key]) if key == "betas" else now[key]
        ):
            shown = ",".join(map(str, was)) if key == "betas" else was
            raise UserError(
                f"--resume {ckpt}: the checkpoint was trained with {flag} {shown}; leave {flag} "
                f"out to continue with it (got "
                f"{','.join(map(str, now[key])) if key == 'betas' else now[key]})"
            )


def _open_tensors(ckpt: Path, spec: ModelSpec) -> tuple[SafetensorsWeights, SafetensorsWeights]:
    optim_file = ckpt / OPTIM_FILE
    if not optim_file.is_file():
        raise CheckpointError(f"{optim_file} is missing: the checkpoint is incomplete")
    weights, moments = SafetensorsWeights(ckpt), SafetensorsWeights.single(optim_file)
    names = param_names(spec)
    _check_tensors(weights, {n: param_shape(spec, n) for n in names}, ckpt)
    want = {n + s: param_shape(spec, n) for n in names for s in (EXP_AVG, EXP_AVG_SQ)}
    _check_tensors(moments, want, optim_file)
    return weights, moments


def _check_tensors(
    found: SafetensorsWeights, want: dict[str, tuple[int, ...]], where: Path
) -> None:
    missing = [n for n in want if n not in found]
    if missing:
        raise CheckpointError(f"{where} lacks {len(missing)} tensors, e.g. {missing[0]}")
    for name, shape in want.items():
        dtype, got = found.header(name)
        if dtype not in FLOAT_DTYPES or got != shape:
            raise CheckpointError(
                f"{where}: {name} is {dtype} {got}, expected a float tensor of shape {shape}"
            )
