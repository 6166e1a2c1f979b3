"""`slide compare-trace`: a predicted and a measured trace of the same plan, side by side:
step time, eta and its terms, per-lane busy time, with their errors, and an aligned Gantt."""

from __future__ import annotations

import argparse
from pathlib import Path

from slide import preflight
from slide.errors import UserError
from slide_ir.ir.trace import Trace, trace_metrics

NAME = "compare-trace"
HELP = "compare a predicted trace with a measured one (errors per metric and lane, aligned Gantt)"
FIELDS = ("step_time_s", "tokens_per_s", "eta", "t_bwd_s", "t_d2h_s", "t_update_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "predicted", help="trace JSON in Slide's format (slide simulate --save-trace)"
    )
    parser.add_argument("measured", help="trace JSON in Slide's format (slide train --save-trace)")
    parser.add_argument("--gantt", metavar="PNG", help="write the two timelines, aligned")


def run(args: argparse.Namespace) -> int:
    preflight.image_file("--gantt", args.gantt)
    predicted, measured = _load(args.predicted), _load(args.measured)
    p, m = trace_metrics(predicted), trace_metrics(measured)
    print(f"{'':16s} {'predicted':>12s} {'measured':>12s} {'error':>8s}")
    for name in FIELDS:
        a, b = getattr(p, name), getattr(m, name)
        print(f"{name:16s} {a:12.4g} {b:12.4g} {_err(a, b):>8s}")
    steady_p, steady_m = set(p.steady_steps), set(m.steady_steps)
    busy_p, busy_m = _busy(predicted, steady_p), _busy(measured, steady_m)
    for lane in sorted(set(busy_p) | set(busy_m)):
        a, b = busy_p.get(lane, 0.0) / len(steady_p), busy_m.get(lane, 0.0) / len(steady_m)
        print(f"{'busy ' + lane:16s} {a:12.4g} {b:12.4g} {_err(a, b):>8s}")
    if args.gantt:
        from slide.gantt import plot_gantt_pair

        print(f"Gantt written to {plot_gantt_pair(predicted, measured, args.gantt)}")
    return 0


def _load(path: str) -> Trace:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"trace file {path} does not exist")
    try:
        return Trace.from_json(file.read_text())
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"{path} is not a Slide trace ({exc}); Chrome traces cannot be compared"
        ) from None


def _busy(trace: Trace, steps: set[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in trace.spans:
        if s.step in steps:
            out[s.lane] = out.get(s.lane, 0.0) + s.duration
    return out


def _err(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if measured else "-"
