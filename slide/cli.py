"""The `slide` command line: one subcommand per module in `slide.commands`.

Each subcommand module has `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`;
`args.given` holds the destinations the command line set itself (not by default), for commands
whose values may come from elsewhere when a flag is left out (a checkpoint, a saved plan); a
command with a `--config` flag takes the values of that TOML file (`slide.run_config`) where
no flag is typed, and they count as given.
A mistyped flag is reported with the subcommand's own usage.
User errors (`UserError`, or the ValueErrors our configs raise) print one line and exit 2:
no traceback for a mistyped name or a non-positive batch. `StopRun` ends a command early with
its own line and code (0: nothing to do; 130: interrupted), as does Ctrl-C (130).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from executor.phases import mark_command_start
from slide.commands import COMMANDS
from slide.errors import StopRun, UserError
from slide.run_config import CONFIG_DEST, apply_config, bare_parser

GPU_STACK = ("torch", "triton", "transformers", "safetensors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slide",
        description="Plan, simulate and run layer-sliding full fine-tuning on one GPU or several.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(run=module.run, add_arguments=module.add_arguments, command_parser=p)
    return parser


def given_flags(
    add_arguments: Callable[[argparse.ArgumentParser], None], argv: Sequence[str]
) -> frozenset[str]:
    """The destinations `argv` sets itself. argparse keeps no such record, so `argv` is parsed
    again by a parser of the same arguments with no defaults."""
    return frozenset(vars(bare_parser(add_arguments).parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    mark_command_start()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top level's
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv  # what a launcher's ranks re-run
    args.given = given_flags(args.add_arguments, argv[argv.index(args.command) + 1 :])
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        if getattr(args, CONFIG_DEST, None):
            args.given = apply_config(args, args.add_arguments, args.config)
        code = int(args.run(args))
        sys.stdout.flush()  # a closed pipe fails here, inside the try, not at interpreter exit
        return code
    except BrokenPipeError:  # `slide plan | head`: the reader has all it wanted
        # the Python docs' recipe: stdout to devnull, so the final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except StopRun as exc:
        if str(exc):  # a data-parallel rank other than 0 ends quietly where rank 0 speaks
            print(f"slide {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"slide {args.command}: interrupted", file=sys.stderr)
        return 130
    except (UserError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"slide {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in GPU_STACK:
            raise
        print(
            f"slide {args.command}: error: needs {exc.name}, which is not installed here: "
            "install the GPU stack with `pip install -e '.[gpu]'`",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
