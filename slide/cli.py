"""The `slide` command line: one subcommand per module in `slide.commands`.

Each subcommand module has `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`.
User errors (`UserError`, or the ValueErrors our configs raise) print one line and exit 2:
no traceback for a mistyped name or a non-positive batch. `StopRun` ends a command early with
its own line and code (0: nothing to do; 130: interrupted), as does Ctrl-C (130).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from slide.commands import COMMANDS
from slide.errors import StopRun, UserError

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
        p.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a launcher's ranks re-run
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
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
    except (UserError, ValueError, FileNotFoundError) as exc:
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
