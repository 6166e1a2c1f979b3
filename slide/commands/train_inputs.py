"""Where `slide train` takes a value whose flag is left out, and what it says before it starts.

- `--plan FILE` fixes the model, machine and training configuration, so their flags beside it
  are refused (make another plan instead); the plan carries its steps, which `--steps` replaces.
- `--resume` continues a run with that run's values (`slide.resume.recorded_flags`: model,
  data, seed, batch shape, steps, optimizer, clipping), each replaced by its flag where one is
  given. `slide.resume` refuses those that would not continue the same run; a different
  `--data` is allowed, and said.
- Before the run, once: a model that starts from a random init (and how to load weights), and
  a run whose trained model will not be saved.

Only values a user typed (`args.given`, see `slide.cli`) override; a flag's default never does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from slide.commands.common import add_machine_overrides, add_train_config
from slide.errors import UserError
from slide.preflight import TrainRun
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model

log = logging.getLogger(__name__)


def _dests(add_arguments: Callable[[argparse.ArgumentParser], None]) -> frozenset[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return frozenset(vars(parser.parse_args([])))


# what a saved plan fixes: every flag of its model, machine and configuration but --steps, and
# --nvme-dir (where this run's drive files go: the plan holds the drive count)
_PLANNED = _dests(add_train_config) | _dests(add_machine_overrides) | {"model", "machine"}
PLAN_FIXED = _PLANNED - {"steps", "nvme_dir"}


def resolve(args: argparse.Namespace) -> TrainRun:
    """Put the saved plan's steps and the checkpoint's values into `args` where no flag is
    given; what the checks before planning need of the run (`slide.preflight.check_train`)."""
    saved = _from_plan(args) if args.plan else None
    resumed = _from_checkpoint(args) if args.resume else None
    spec, seq = saved or (load_model(args.model), args.seq)
    return TrainRun(model=spec.name, context=spec.max_position_embeddings, seq=seq,
                    resumed=resumed)  # fmt: skip


def notices(args: argparse.Namespace, run: TrainRun) -> list[str]:
    """What the user should hear before a run starts that it would otherwise not see."""
    from slide.weights import has_weights

    said = []
    model_dir = Path(args.model) if not args.plan and Path(args.model).is_dir() else None
    if not args.resume and not (model_dir and has_weights(model_dir)):
        what = f"{model_dir} holds no model.safetensors" if model_dir else (
            f"{run.model} is an architecture from the catalog, without weights")  # fmt: skip
        said.append(
            f"{what}: training starts from a random init (--seed {args.seed}). To fine-tune "
            "pretrained weights, pass --model DIR, a directory with config.json and "
            "*.safetensors (e.g. `huggingface-cli download ORG/NAME --local-dir DIR`)"
        )
    if not args.out:
        said.append("no --out: the trained model will not be saved (pass --out DIR to keep it)")
    return said


def _from_plan(args: argparse.Namespace) -> tuple[ModelSpec, int] | None:
    """The saved plan's model and sequence length, its steps taken unless --steps is given,
    read without re-planning; None where the file is not a plan (`slide.train_prepare` reads
    it and says what is wrong)."""
    fixed = sorted(PLAN_FIXED & args.given)
    if fixed:
        flags = ", ".join("--" + dest.replace("_", "-") for dest in fixed)
        raise UserError(
            f"--plan {args.plan} fixes the model, machine and training configuration: drop "
            f"{flags}, or make a plan with them (slide plan ... --out FILE)"
        )
    try:
        saved = json.loads(Path(args.plan).read_text(encoding="utf-8"))
        spec = ModelSpec.from_hf_config(saved["model"], name=saved["model_name"], origin=args.plan)
        seq, steps = int(saved["config"]["seq"]), int(saved["config"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if "steps" not in args.given:
        args.steps = steps
    return spec, seq


def _from_checkpoint(args: argparse.Namespace) -> tuple[Path, int]:
    """The checkpoint's values into `args` where no flag is given; the checkpoint and its
    steps done."""
    from slide.resume import recorded_flags

    recorded = recorded_flags(args.resume)
    for dest, value in recorded.flags.items():
        if dest not in args.given:
            setattr(args, dest, value)
    was = recorded.flags.get("data")
    if "data" in args.given and "data" in recorded.flags and was != os.path.abspath(args.data):
        log.warning(
            "--data %s is not the data %s was trained on (%s): the run goes on with --data, "
            "from the position that run had reached in its own",
            args.data, recorded.directory, was or "the bundled corpus",
        )  # fmt: skip
    return recorded.directory, recorded.steps_done
