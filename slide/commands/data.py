"""`slide data`: tokenize a data file once into its token cache (`slide.token_cache`), with a
progress bar, and say what a run will see: its tokens, targets, windows at `--seq` and the
cache's path. `slide train` reads the same cache, and prepares it where it is missing.
"""

from __future__ import annotations

import argparse

from slide.data_formats import TRUNCATION
from slide.errors import UserError
from slide.packing import PACKING

NAME = "data"
HELP = "tokenize a data file once into the cache slide train reads; count its windows"
FORMATS = "JSONL, a JSON array, parquet, arrow, CSV or text (these need --tokenizer)"


def add_data_arguments(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """--data, --tokenizer, --data-cache, --truncation and --packing: shared with `slide train`."""
    default = "" if required else " [the bundled corpus]"
    parser.add_argument(
        "--data", required=required, help=f"{FORMATS}, or a 1-D token-id .npy{default}"
    )
    parser.add_argument("--tokenizer", help="local HF tokenizer directory (all data but .npy)")
    parser.add_argument(
        "--data-cache",
        help="directory of the token caches (the data tokenized once, memory-mapped) "
        "[~/.cache/slide/tokens]",
    )
    parser.add_argument(
        "--truncation",
        choices=TRUNCATION,
        default="truncate",
        help="chat data ({messages: [{role, content}]}, rendered by the tokenizer's chat "
        "template, trained on the assistant's turns): a conversation longer than --seq tokens "
        "is cut to its first --seq (truncate) or left out (drop); the run says how many "
        "[truncate]",
    )
    parser.add_argument(
        "--packing",
        choices=PACKING,
        default="stream",
        help="stream: the documents as one token stream cut into windows of --seq (a window's "
        "documents attend to each other); documents: whole documents packed into samples of "
        "--seq (one longer than --seq in pieces of --seq), each token attending only to its "
        "own document's, RoPE positions from 0 in each, no label across a boundary (needs "
        "data Slide tokenizes, not a .npy) [stream]",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser, required=True)
    parser.add_argument("--seq", type=int, default=128, help="count windows of this length [128]")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from slide.chat_data import LengthLimit
    from slide.data import load_token_stream, sample_count

    if args.seq < 1:
        raise UserError(f"--seq must be a token count >= 1, got {args.seq}")
    stream = load_token_stream(args.data, tokenizer_dir=args.tokenizer,
                               cache_dir=args.data_cache, progress=not args.no_progress,
                               limit=LengthLimit(args.seq, args.truncation))  # fmt: skip
    print(f"tokens   {len(stream.ids):,} ({stream.targets:,} of them targets; largest id "
          f"{stream.max_id:,})")  # fmt: skip
    samples = sample_count(stream, args.seq, args.packing, args.data)
    print(f"windows  {samples:,} of {args.seq} tokens (--seq {args.seq}, --packing "
          f"{args.packing})")  # fmt: skip
    print(f"cache    {stream.cache or 'none: a .npy is read in place'}")
    return 0
