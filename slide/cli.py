"""The `slide` command line: one subcommand per module in `slide.commands`.

Each subcommand module has `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`.
User errors (`UserError`, or the ValueErrors our configs raise) print one line and exit 2:
no traceback for a mistyped name or a non-positive batch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from slide.commands import COMMANDS
from slide.errors import UserError

GPU_STACK = ("torch", "triton", "transformers", "safetensors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slide",
        description="Plan, simulate and run layer-sliding full fine-tuning on one GPU.",
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
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        return int(args.run(args))
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
