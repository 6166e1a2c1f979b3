"""`slide train`: fine-tune a model from the planner's Graph with the executor.

Everything the user can get wrong (model, machine, data, plan feasibility, resume mismatch,
an `--out` holding someone else's files) is checked before the model's weights are touched.
Checkpoints are complete or absent (see slide/checkpoints.py); Ctrl-C finishes the step in
flight, saves and exits 130; a second Ctrl-C aborts at once.

`--config run.toml` takes every flag from a file (`slide.run_config`; typed flags win); the
values the run resolved are written to OUT/config.toml and the first metrics line, so
`--config OUT/config.toml` repeats the run.

`--nproc N` trains N data-parallel ranks: this process checks the request, then starts them
the torchrun way (`slide.launch`); a process torchrun started is one of the ranks.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from slide import json_out, preflight, run_config
from slide.commands import train_inputs
from slide.commands.common import (
    add_machine_overrides,
    add_train_config,
    drive_count,
    nvme_dirs,
    train_config,
)
from slide.commands.data import add_data_arguments
from slide.commands.train_inputs import PLAN_FIXED
from slide.errors import StopRun, UserError

if TYPE_CHECKING:
    from executor.ranks import Ranks
    from slide.train_request import TrainRequest

log = logging.getLogger(__name__)
NAME = "train"
HELP = "fine-tune all parameters of a model on one GPU or N (--nproc), sliding its layers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="a TOML file of this command's flags (keys as the flags, without the dashes: "
        "seq = 128, lr-schedule = 'cosine', no-shuffle = true); flags typed here override it. "
        "The run's resolved flags are written to OUT/config.toml (--config OUT/config.toml "
        "repeats the run) and the first --metrics line, and logged with -v",
    )
    parser.add_argument(
        "--model",
        default="tiny-llama",
        help="catalog name, or a directory with config.json (+ safetensors) [tiny-llama]",
    )
    parser.add_argument(
        "--machine",
        default="auto",
        help="'auto' (on CUDA: this host's figures, measured once and cached per host; "
        "`slide calibrate` refreshes them), a catalog name or a .toml profile [auto]",
    )
    add_machine_overrides(parser)
    add_train_config(parser)
    parser.set_defaults(steps=20, batch=4, seq=128)
    parser.add_argument(
        "--nproc",
        type=int,
        help="data-parallel ranks, one GPU each (gloo on --device cpu): --batch is the global "
        "batch, each rank taking batch / nproc; under torchrun, leave it out or give its "
        "WORLD_SIZE [1]",
    )
    parser.add_argument("--plan", help="run a saved plan (slide plan --out); overrides the above")
    add_data_arguments(parser)
    add_eval_arguments(parser)
    parser.add_argument("--no-shuffle", action="store_true", help="take samples in file order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="cpu: the same graph on the host, bitwise reproducible run to run (README: 'Bitwise here means') [cuda if available]",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="compute dtype [bfloat16 on cuda, float32 on cpu]",
    )
    _add_optimizer(parser.add_argument_group("the optimizer"))
    _add_run_directory(parser.add_argument_group("checkpoints (--out, --resume)"))
    _add_logging(parser.add_argument_group("metrics, traces and progress"))


def _add_optimizer(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--lr", type=float, default=1e-5, help="peak learning rate [%(default)s]")
    group.add_argument("--lr-schedule", choices=("constant", "cosine", "linear"), default="cosine",
                       help="the LR after the warm-up, to 0 at the last step [cosine]")  # fmt: skip
    group.add_argument("--warmup-steps", type=int, default=0, help="linear LR warm-up steps [0]")
    group.add_argument(
        "--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay [0.0]"
    )
    group.add_argument("--betas", default="0.9,0.999", help="Adam betas as b1,b2 [0.9,0.999]")
    group.add_argument("--eps", type=float, default=1e-8, help="Adam epsilon [1e-8]")


def _add_run_directory(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--out",
        help="run directory: checkpoints/step-N/, `latest`, and the newest HF checkpoint "
        "(from_pretrained(OUT) loads it); refused if it holds files Slide did not write",
    )
    group.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --out anyway (Slide's files only: nothing else there is "
        "touched), or start a new run over a previous run's checkpoints",
    )
    group.add_argument(
        "--save-every", type=int, default=0, help="also checkpoint every N steps [0: at the end]"
    )
    group.add_argument("--keep", type=int, default=2, help="checkpoints kept in --out [2]")
    group.add_argument(
        "--resume", help="continue from a run directory (its latest checkpoint) or a checkpoint"
    )
    group.add_argument(
        "--extend-schedule",
        action="store_true",
        help="with --resume and a different --steps: re-plan the LR schedule over the new "
        "--steps from the step reached (the LR jumps to that step's value on the new schedule)",
    )


def _add_logging(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--metrics", help="write one JSON object per step to this .jsonl file")
    group.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also write each step's metrics (loss, lr, step time, tokens/s, ...) as "
        "TensorBoard scalars into DIR (needs pip install 'slide[tensorboard]')",
    )
    group.add_argument("--trace", help="write the measured Chrome trace JSON here")
    group.add_argument(
        "--trace-steps",
        help="steps A:B (inclusive, counted from this run's first) that --trace, --gantt and "
        "--save-trace show and the summary's lane figures (eta) are measured on; only their "
        "spans are kept (the summary's tokens/s counts every steady step) "
        "[1:4, or 7:10 where the run re-checks its placement after step 6]",
    )
    group.add_argument(
        "--log-every",
        type=int,
        default=10,
        help="every N steps the metrics line adds tokens/s and each lane's busy share over "
        "those N [10]",
    )
    group.add_argument(
        "--max-skipped-steps",
        type=int,
        default=10,
        help="with --clip global, stop after this many steps in a row skipped for a "
        "non-finite gradient norm [10]",
    )
    group.add_argument("--gantt", help="write the measured Gantt chart PNG here")
    group.add_argument("--save-trace", help="write the measured Trace in Slide's format here")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    group.add_argument(
        "--no-replan",
        action="store_true",
        help="keep the plan made at the start (by default a CUDA run re-fits its machine "
        "profile to its first steady steps and moves to the placement the search then "
        "predicts >= 3%% faster)",
    )


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The eval loss: forward-only passes on the same sliding schedule between steps."""
    parser.add_argument(
        "--eval-data",
        metavar="FILE",
        help="evaluate on this file (any --data format, read with --tokenizer): the mean token "
        "cross-entropy of its windows, into --metrics, --tensorboard and the summary",
    )
    parser.add_argument(
        "--eval-fraction",
        type=float,
        metavar="F",
        help="or hold out this fraction (0 < F < 1) of the training data's windows, chosen by "
        "--seed, and evaluate on them; training never draws them",
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        metavar="N",
        help="evaluate after every N steps, and after the last [only after the last]",
    )
    parser.add_argument(
        "--eval-batches",
        type=int,
        default=16,
        metavar="K",
        help="an eval reads the eval set's first K batches of --batch x --seq (the same ones "
        "each time; 0: the whole set, its last batch padded) [16]",
    )


def run(args: argparse.Namespace) -> int:
    from slide import launch
    from slide.train_prepare import device_of  # torch only when training
    from slide.training import check_training

    resolved = train_inputs.resolve(args)
    preflight.check_train(args, resolved)
    world = launch.torchrun_world()
    request = _request(args, train_inputs.notices(args, resolved), _run_config(args))
    if world is None and args.nproc not in (None, 1):
        # nothing starts before the request is checked; on CUDA the check may measure the GPU
        # (--machine auto), so it runs in a process of its own whose CUDA context ends with it
        # instead of holding rank 0's GPU memory for the whole run
        if device_of(request).type == "cuda":
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=spawn) as checker:
                checker.submit(check_training, request, args.nproc).result()
        else:
            check_training(request, args.nproc)
        return launch.launch(args.argv, args.nproc, verbose=args.verbose)
    if world is not None and args.nproc not in (None, world):
        raise UserError(f"--nproc {args.nproc}, but torchrun started {world} ranks: "
                        "leave --nproc out under torchrun, or give the same count")  # fmt: skip
    if world is None:
        return _train(args, request, None)
    from executor.ranks import init_from_env

    launch.die_with_launcher()
    ranks = init_from_env(device_of(request).type)
    if ranks is None:  # torchrun started one rank
        return _train(args, request, None)
    if not ranks.is_main and not args.verbose:  # rank 0 speaks for the run
        logging.getLogger().setLevel(logging.ERROR)
    try:
        with launch.rank_errors(ranks):
            return _train(args, request, ranks)
    finally:
        ranks.close()


def _train(args: argparse.Namespace, request: TrainRequest, ranks: Ranks | None) -> int:
    from slide.training import run_training

    try:
        summary = run_training(request, ranks)
    except (StopRun, KeyboardInterrupt) as stop:
        if isinstance(stop, KeyboardInterrupt) or stop.code == 130:
            _exiting()
        raise
    _exiting()
    if ranks is not None and not ranks.is_main:
        if summary["interrupted"]:
            raise StopRun("", code=130)  # rank 0 says what it saved
        return 0
    print(json_out.dumps(summary, indent=2))
    if summary["interrupted"]:
        saved = (
            f"checkpoint {summary['checkpoint']}; continue with --resume {args.out}"
            if summary["checkpoint"]
            else "nothing saved (no --out)"
        )
        raise StopRun(f"interrupted after step {summary['steps_done']}: {saved}", code=130)
    return 0


def _run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The flags' values the run resolved (a checkpoint's where it resumes), as config keys;
    beside --plan, none of those the plan fixes (they would be refused when read back)."""
    flags = run_config.resolved(args, add_arguments)
    if args.plan:
        flags = {k: v for k, v in flags.items() if k.replace("-", "_") not in PLAN_FIXED}
    log.info("slide train, resolved config (--config reads it back):\n%s",
             run_config.to_toml(flags).rstrip())  # fmt: skip
    return flags


def _request(args: argparse.Namespace, notices: list[str], flags: dict[str, Any]) -> TrainRequest:
    from slide.train_request import TrainRequest

    return TrainRequest(
        model=args.model,
        machine=args.machine,
        ram_gb=args.ram_gb,
        nvme=drive_count(args),
        # packed documents' attention is masked: the planner prices SDPA's masked kernel
        config=train_config(args, document_mask=args.packing == "documents"),
        plan_file=args.plan,
        data=args.data,
        tokenizer=args.tokenizer,
        data_cache=args.data_cache,
        truncation=args.truncation,
        eval_data=args.eval_data,
        eval_fraction=args.eval_fraction,
        eval_every=args.eval_every,
        eval_batches=args.eval_batches,
        packing=args.packing,
        shuffle=not args.no_shuffle,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        lr=args.lr,
        lr_schedule=args.lr_schedule,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        betas=_betas(args.betas),
        eps=args.eps,
        out=args.out,
        overwrite=args.overwrite,
        save_every=args.save_every,
        keep=args.keep,
        resume=args.resume,
        extend_schedule=args.extend_schedule,
        nvme_dirs=nvme_dirs(args),
        metrics=args.metrics,
        tensorboard=args.tensorboard,
        trace=args.trace,
        trace_steps=preflight.step_range(args.trace_steps) if args.trace_steps else None,
        log_every=args.log_every,
        max_skipped_steps=args.max_skipped_steps,
        gantt=args.gantt,
        save_trace=args.save_trace,
        progress=not args.no_progress,
        replan=not args.no_replan,
        notices=tuple(notices),
        run_config=flags,
    )


def _betas(text: str) -> tuple[float, float]:
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--betas must be two numbers like 0.9,0.999, got {text!r}") from None
    return b1, b2


def _exiting() -> None:
    """The run is over (done, or stopped by Ctrl-C) and everything it writes is written: a
    Ctrl-C from here can stop nothing, and in the interpreter's shutdown it would kill the
    process with SIGINT (exit -2 after a run that succeeded: 9 of 232 tries with the signal
    2.3-2.5 s into a 5-step tiny-llama run), or abort it while torch's threads unwind. So it
    is ignored from here to the exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
