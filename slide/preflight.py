"""Every option and output path of a command, checked before anything is planned or allocated.

A check that fails after the work loses the work: a Gantt chart to a missing directory, or a
trace window past the run's last step, used to fail after training, the summary with it. So
the commands call these first, and each problem is one `UserError` line that names the flag,
the bad value and what would be valid. Nothing here writes anything.

An output file may be new, and so may the directories above it (the writers create them), but
the nearest one that exists must be a directory this user can write in.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slide import tensorboard_scalars
from slide.checkpoints import RunDir
from slide.errors import UserError
from slide_ir.specs.config import PlacementMode, TrainConfig
from slide_ir.specs.hardware import Machine, ram_bytes
from slide_ir.specs.hardware_parts import GIB


def output_file(flag: str, path: str | None, suffixes: Iterable[str] = ()) -> None:
    """`path` (if given) can be written as a file; its suffix one of `suffixes` if any."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{flag} {path}: a directory; name a file in it")
    allowed = sorted(suffixes)
    if allowed and target.suffix.lower().removeprefix(".") not in allowed:
        raise UserError(
            f"{flag} {path}: cannot write a {target.suffix or 'suffix-less'} file; "
            f"end it in one of {', '.join('.' + s for s in allowed)}"
        )
    where = next(p for p in target.absolute().parents if p.exists())
    if not where.is_dir():
        raise UserError(f"{flag} {path}: {where} is a file, not a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: {where} is not writable by this user")
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{flag} {path}: the file exists and is not writable by this user")


def output_directory(flag: str, path: str) -> None:
    """`path` is a directory this user can write in, or one the writer can create."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UserError(f"{flag} {path}: a file; name a directory")
    where = next(p for p in [target.absolute(), *target.absolute().parents] if p.exists())
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: {where} is not a directory this user can write in")


def image_file(flag: str, path: str | None) -> None:
    """`path` (if given) can be written as a picture matplotlib knows how to save."""
    if path:
        from matplotlib.backend_bases import FigureCanvasBase

        output_file(flag, path, FigureCanvasBase.get_supported_filetypes())


def step_range(text: str) -> tuple[int, int]:
    """`--trace-steps A:B`: inclusive, 1 <= A <= B."""
    try:
        first, last = (int(x) for x in text.split(":"))
    except ValueError:
        raise UserError(f"--trace-steps must be A:B like 1:4, got {text!r}") from None
    if not 1 <= first <= last:
        raise UserError(f"--trace-steps must be A:B with 1 <= A <= B, got {text!r}")
    return first, last


def gpu_memory(asked: float | None, machine: Machine) -> None:
    """`--gpu-memory-gb` is a cap: above the GPU's own memory it would be silently ignored."""
    own = machine.gpu.memory_bytes / GIB
    if asked is not None and asked > own + 1e-9:
        raise UserError(
            f"--gpu-memory-gb {asked:g} is more than {machine.name}'s GPU has ({own:.1f} GiB): "
            f"give at most {own:.1f}, or leave it out to plan for all of it"
        )


def schedule_options(config: TrainConfig) -> None:
    """Options the schedule would ignore, refused: they belong to another schedule."""
    if config.schedule != "sliding":
        sliding = {"--resident": config.resident, "--streamed": config.streamed,
                   "--keep-activations": config.keep_activations,
                   "--cache-units": config.cache_units}  # fmt: skip
        given = [f"{flag} {value}" for flag, value in sliding.items() if value not in ("auto", 0)]
        if config.placement == PlacementMode.SMALL:  # "fast", the default, says nothing
            given.append("--placement small")
        if given:
            raise UserError(
                f"{', '.join(given)}: only --schedule sliding places units (--schedule "
                f"{config.schedule} keeps every BF16 weight on the GPU): drop "
                f"{'them' if len(given) > 1 else 'it'}, or use "
                "--schedule sliding"
            )
    if config.clip != "global" and config.speculate not in ("auto", 0):
        raise UserError(
            f"--speculate {config.speculate}: only global clipping's updates speculate (they "
            f"wait for the step's norm); --clip {config.clip} updates each unit as its gradient "
            "lands: drop --speculate, or use --clip global"
        )
    if config.schedule == "gpu-only" and config.optimizer != "cpu":
        raise UserError(
            f"--optimizer {config.optimizer}: --schedule gpu-only keeps the optimizer state on "
            "the GPU; use --schedule sliding or zero-offload to keep it on NVMe"
        )


def clip_norm(args: argparse.Namespace) -> None:
    """--clip-norm typed (not its default) where nothing clips, refused."""
    if "clip_norm" in getattr(args, "given", ()) and args.clip == "none":
        raise UserError(
            f"--clip-norm {args.clip_norm} does nothing with --clip none: use --clip global "
            "or per-unit, or drop --clip-norm"
        )


def eval_options(args: argparse.Namespace) -> None:
    """--eval-data or --eval-fraction (one of them), --eval-every and --eval-batches."""
    evaluates = args.eval_data is not None or args.eval_fraction is not None
    if args.eval_data is not None and args.eval_fraction is not None:
        raise UserError(f"--eval-data {args.eval_data} and --eval-fraction {args.eval_fraction}: "
                        "give one eval set, a file or a held-out fraction")  # fmt: skip
    if args.eval_fraction is not None and not 0 < args.eval_fraction < 1:
        raise UserError(f"--eval-fraction must be between 0 and 1 (exclusive), got "
                        f"{args.eval_fraction}")  # fmt: skip
    if args.eval_data is not None and not Path(args.eval_data).is_file():
        raise UserError(f"--eval-data {args.eval_data}: no such file")
    if args.eval_every is not None and args.eval_every < 1:
        raise UserError(f"--eval-every must be a step count >= 1, got {args.eval_every}")
    if args.eval_batches < 0:
        raise UserError(f"--eval-batches must be a batch count >= 1, or 0 for the whole eval "
                        f"set, got {args.eval_batches}")  # fmt: skip
    for given in ("eval_every", "eval_batches"):
        if given in args.given and not evaluates:
            raise UserError(f"--{given.replace('_', '-')} does nothing without an eval set: add "
                            "--eval-data FILE or --eval-fraction F")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TrainRun:
    """What `check_train` needs of a run beyond its flags, resolved without planning."""

    model: str  # the model's name
    context: int  # the tokens it reads at most (max_position_embeddings)
    seq: int  # the run's sequence length (a saved plan's, else --seq)
    resumed: tuple[Path, int] | None  # the checkpoint a resume continues, and its steps done


def check_train(args: argparse.Namespace, run: TrainRun) -> None:
    """`slide train`'s values, once a saved plan's and a checkpoint's are in `args`."""
    if args.ram_gb is not None:
        ram_bytes(args.ram_gb)
    if run.seq > run.context:
        raise UserError(
            f"--seq {run.seq} exceeds {run.model}'s context of {run.context} tokens "
            f"(max_position_embeddings): use --seq {run.context} or less"
        )
    if args.warmup_steps > args.steps:
        raise UserError(
            f"--warmup-steps {args.warmup_steps} exceeds the run's {args.steps} steps (the LR "
            f"would never reach --lr): use at most {args.steps}"
        )
    if args.packing == "documents" and args.data and args.data.endswith(".npy"):
        raise UserError(
            f"--packing documents: --data {args.data} is token ids with no document "
            "boundaries; give data Slide tokenizes (JSONL, JSON, parquet, arrow, CSV or text, "
            "with --tokenizer), or --packing stream"
        )
    eval_options(args)
    to_run = args.steps - (run.resumed[1] if run.resumed else 0)
    if args.trace_steps and to_run >= 1:  # none left: `slide.resume` says there is nothing to do
        _, last = step_range(args.trace_steps)
        if last > to_run:
            raise UserError(
                f"--trace-steps {args.trace_steps} reaches past this run's {to_run} steps "
                f"(counted from its first): use A:B within 1:{to_run}"
            )
    for flag, path in (("--metrics", args.metrics), ("--trace", args.trace),
                       ("--save-trace", args.save_trace)):  # fmt: skip
        output_file(flag, path)
    image_file("--gantt", args.gantt)
    if args.tensorboard:
        output_directory("--tensorboard", args.tensorboard)
        tensorboard_scalars.summary_writer_class()
    if args.out:
        RunDir.check(args.out, keep=args.keep, overwrite=args.overwrite, resumed=run.resumed)
