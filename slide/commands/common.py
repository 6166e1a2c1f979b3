"""Arguments shared by every command that plans: model, machine, training configuration."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from slide import preflight
from slide.errors import UserError
from slide_ir.specs.config import (
    ACTIVATION_CHOICES,
    CLIP_MODES,
    HELD_GRAD_PLACES,
    HOST_WEIGHT_MODES,
    MOMENT_DTYPES,
    OPTIMIZER_PLACES,
    PLACEMENTS,
    SCHEDULES,
    TrainConfig,
    parse_cache_units,
    parse_count_or_auto,
)
from slide_ir.specs.hardware import Machine, load_machine
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_MACHINE = "paper-pc-4090"
RAM_GB_HELP = (
    "override the machine's DRAM, in GiB (2^30 bytes, as DIMMs and `free -g` count it; the "
    "plan prints it in GiB too)"
)


def add_model_machine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"catalog name (slide models), config.json or model dir [{DEFAULT_MODEL}]",
    )
    parser.add_argument(
        "--machine",
        default=DEFAULT_MACHINE,
        help="catalog name (slide machines), a .toml profile, or auto (this host's GPU, "
        f"measured once and cached, as slide train plans) [{DEFAULT_MACHINE}]",
    )
    add_machine_overrides(parser)


def add_machine_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ram-gb", type=float, help=RAM_GB_HELP)
    parser.add_argument("--nvme", type=int, help="override the number of NVMe drives")
    parser.add_argument(
        "--nvme-dir",
        action="append",
        dest="nvme_dir",
        metavar="DIR",
        help="a writable directory on one NVMe drive, for that drive's file; repeat it once per "
        "drive (the drive count is then the number given)",
    )


def add_train_config(parser: argparse.ArgumentParser, *, batch: bool = True) -> None:
    """The training configuration's flags, in `--help`'s groups: the step, the placement, where
    the state lives, clipping."""
    _add_step(parser.add_argument_group("the step"), batch=batch)
    _add_placement(parser.add_argument_group("placement (what runs where on the GPU)"))
    _add_homes(parser.add_argument_group("where the state lives"))
    _add_clipping(parser.add_argument_group("gradient clipping"))


def _add_step(group: argparse._ArgumentGroup, *, batch: bool) -> None:
    if batch:
        group.add_argument("--batch", type=int, default=16, help="micro-batch size [%(default)s]")
    group.add_argument("--seq", type=int, default=1024, help="sequence length [%(default)s]")
    group.add_argument("--steps", type=int, default=3, help="optimizer steps [%(default)s]")
    group.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step [1]")
    group.add_argument("--schedule", choices=SCHEDULES, default="sliding")
    group.add_argument(
        "--reduce-bucket",
        type=float,
        default=5e8,
        help="--schedule zero-offload: DeepSpeed's reduce_bucket_size, in elements [5e8]",
    )


def _add_placement(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="fast",
        help="how the 'auto' choices below are made: fast = the shortest predicted step that "
        "fits (resident, streamed and sliding units, where the layer inputs live and the cache "
        "depth, searched together); small = the smallest footprint (everything sliding, inputs "
        "on the host, 3 cache units) [fast]",
    )
    group.add_argument(
        "--gpu-memory-gb",
        type=float,
        help="use at most this much GPU memory, in GiB: the plan fits it and `slide train` caps "
        "torch's allocator there (a shared GPU, a second job, a smaller card's stand-in) [all of it]",
    )
    group.add_argument(
        "--cache-units",
        default="auto",
        help="GPU cache units for sliding layers (>= 2) or 'auto' (chosen by --placement) [auto]",
    )
    group.add_argument(
        "--resident",
        default="auto",
        help="units kept whole on the GPU (state and update there): a count or 'auto' (chosen "
        "by --placement) [auto]",
    )
    group.add_argument(
        "--streamed",
        default="auto",
        help="sliding units updated on the GPU, their FP32 state streamed over the link: a "
        "count or 'auto' (chosen by --placement) [auto]",
    )
    group.add_argument(
        "--keep-activations",
        default="auto",
        help="top decoder layers whose forward keeps its autograd tape on the GPU for the "
        "backward instead of recomputing it: a count or 'auto' (chosen by --placement; "
        "--placement small keeps none) [auto]",
    )


def _add_homes(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--activations",
        choices=ACTIVATION_CHOICES,
        default="auto",
        help="where checkpointed layer inputs live; auto: chosen by --placement [auto]",
    )
    group.add_argument(
        "--optimizer",
        choices=OPTIMIZER_PLACES,
        default="cpu",
        help="where FP32 master weights and Adam moments live [cpu]",
    )
    group.add_argument(
        "--moments", choices=MOMENT_DTYPES, default="fp32", help="Adam moment precision [fp32]"
    )
    group.add_argument(
        "--host-weights",
        choices=HOST_WEIGHT_MODES,
        default="auto",
        help="the bf16 weights an upload reads, for host-updated units: cast from the FP32 "
        "master into a small pinned ring just before the upload (with --optimizer nvme the "
        "master is read from the drive for it: 4 B/param more drive reads per upload), or a "
        "pinned copy of every unit that the update writes (2 B/param more host RAM, less host "
        "work); auto: the faster plan that fits, cast on a tie [auto]",
    )
    group.add_argument(
        "--lean-buffers",
        action="store_true",
        help="the host's copy buffers one deep, each the size of the largest unit (one "
        "gradient landing slot, one cast slot, one NVMe staging slot per drive, one for the "
        "layer inputs on NVMe): the least host RAM, "
        "slower; the planner uses them anyway where nothing else fits [off]",
    )
    group.add_argument(
        "--cpu-threads",
        type=int,
        help="host optimizer threads [every core but four, shared by --nproc ranks]",
    )


def _add_clipping(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--clip", choices=CLIP_MODES, default="global",
                        help="gradient clipping: global is torch's clip_grad_norm_ over every "
                        "parameter, as HF Trainer's max_grad_norm (the updates wait for the "
                        "norm and overlap the next forward, or speculate: see --speculate; a "
                        "step with a non-finite norm is skipped; 2-4%% slower than none on the "
                        "H200, measured without speculation); per-unit clips each "
                        "layer's gradient by its own norm before its update (the updates "
                        "overlap the backward); none [global]")  # fmt: skip
    group.add_argument("--clip-norm", type=float, default=1.0, help="max norm for --clip [1.0]")
    group.add_argument(
        "--held-grads",
        choices=HELD_GRAD_PLACES,
        default="auto",
        help="--clip global: where the host-updated gradients wait for the norm: ram (a pinned "
        "slot each, 2 B/param of RAM) or nvme (written to a drive as they land and read back "
        "for their update: 4 B/param more drive traffic a step, no speculation); auto: the "
        "faster plan that fits, ram on a tie [auto]",
    )
    group.add_argument(
        "--speculate",
        default="auto",
        help="--clip global: host-updated units (the first to land) whose update runs as its "
        "gradient lands, its old state saved (12 B/param more RAM), and is redone after the "
        "norm in a step that clips: a count or 'auto' (the least expected step, counting a "
        "rolled-back step as one in four) [auto]",
    )


def load_inputs(args: argparse.Namespace) -> tuple[ModelSpec, Machine]:
    if args.machine != "auto":
        machine = load_machine(args.machine, ram_gb=args.ram_gb, nvme=drive_count(args))
    else:
        machine = this_host(args)
    preflight.gpu_memory(getattr(args, "gpu_memory_gb", None), machine)
    return load_model(args.model), machine


def this_host(args: argparse.Namespace) -> Machine:
    """`--machine auto` for planning: the profile `slide train` plans with on this host's GPU
    (measured once and cached, so a plan and the training after it see the same figures)."""
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            "--machine auto is this host's measured GPU profile, and this host has no CUDA GPU: "
            "name a catalog machine (slide machines) or a .toml profile (slide calibrate --out)"
        )
    from slide.calibration.auto_machine import resolve

    return resolve("auto", torch.device("cuda"), ram_gb=args.ram_gb, nvme=drive_count(args),
                   nvme_dirs=nvme_dirs(args))  # fmt: skip


def drive_count(args: argparse.Namespace) -> int | None:
    """The NVMe drive count asked for: one per `--nvme-dir`, else `--nvme` (None: the machine's)."""
    dirs = nvme_dirs(args)
    if not dirs:
        return args.nvme
    if args.nvme is not None and args.nvme != len(dirs):
        raise UserError(
            f"--nvme {args.nvme} disagrees with the {len(dirs)} --nvme-dir given (one per drive): "
            f"drop --nvme, or give one --nvme-dir per drive"
        )
    return len(dirs)


def nvme_dirs(args: argparse.Namespace) -> tuple[str, ...]:
    """The `--nvme-dir` directories, each checked to exist, be a directory and be writable."""
    dirs = tuple(args.nvme_dir or ())
    for d in dirs:
        if not Path(d).exists():
            raise UserError(f"--nvme-dir {d}: no such directory (create it on the NVMe drive)")
        if not Path(d).is_dir():
            raise UserError(f"--nvme-dir {d}: not a directory")
        if not os.access(d, os.W_OK | os.X_OK):
            raise UserError(f"--nvme-dir {d}: not writable by this user")
    seen: dict[str, str] = {}
    for d in dirs:
        real = os.path.realpath(d)
        if real in seen:
            raise UserError(
                f"--nvme-dir {d} names the same directory as --nvme-dir {seen[real]}: "
                "give one directory per drive"
            )
        seen[real] = d
    return dirs


def train_config(args: argparse.Namespace, **override: object) -> TrainConfig:
    fields: dict[str, object] = {
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "grad_accum": args.grad_accum,
        "schedule": args.schedule,
        "activations": args.activations,
        "optimizer": args.optimizer,
        "moments_dtype": args.moments,
        "host_weights": args.host_weights,
        "lean_buffers": args.lean_buffers,
        "held_grads": args.held_grads,
        "cache_units": parse_cache_units(args.cache_units),
        "resident": parse_count_or_auto("resident", args.resident),
        "streamed": parse_count_or_auto("streamed", args.streamed),
        "keep_activations": parse_count_or_auto("keep_activations", args.keep_activations),
        "cpu_threads": args.cpu_threads,
        "placement": args.placement,
        "gpu_memory_gb": args.gpu_memory_gb,
        "clip": args.clip,
        "clip_norm": args.clip_norm,
        "speculate": parse_count_or_auto("speculate", args.speculate),
        "reduce_bucket": int(args.reduce_bucket),
    }
    fields.update(override)
    preflight.clip_norm(args)
    config = TrainConfig(**fields)  # type: ignore[arg-type]
    preflight.schedule_options(config)
    config.check_held_grads()
    return config
