"""`slide simulate`: plan, simulate a few steps, report throughput, eta and the bottleneck.

Exit status 1 (with the ledger's overflow and suggestions) when the configuration does not fit:
an infeasible plan is reported, never simulated. 2 for a user error, as for `slide plan`.
"""

from __future__ import annotations

import argparse

from simulator.data_parallel import DataParallelResult, simulate_data_parallel
from simulator.run import SimResult, simulate_plan
from slide import json_out, preflight
from slide.commands.common import add_model_machine, add_train_config, load_inputs, train_config
from slide.commands.plan import add_nproc
from slide.fileio import write_atomic
from slide.report import render_placement, render_plan, speculation_lines
from slide.report_dp import render_dp_plan, render_dp_result
from slide_ir.ir.trace import to_chrome_trace
from slide_ir.specs.hardware_parts import GIB

NAME = "simulate"
HELP = "simulate a fine-tuning run: step time, tokens/s, eta, bottleneck, memory over time"
EXIT_CODES = (
    "exit status: 0 it fits and was simulated; 1 it does not fit (its plan is printed, with what "
    "overflows and what would fit, and nothing is simulated); 2 a user error (bad name, value or "
    "file)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_CODES
    add_model_machine(parser)
    add_train_config(parser)
    add_nproc(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of the run")
    parser.add_argument(
        "--gantt-zoom",
        default="auto",
        help="'all', a step number, or 'auto' (one step for deep models) [auto]",
    )
    parser.add_argument("--trace", metavar="JSON", help="write a Chrome trace (open in Perfetto)")
    parser.add_argument("--save-trace", metavar="JSON", help="write the Trace in Slide's format")


def run(args: argparse.Namespace) -> int:
    preflight.output_file("--trace", args.trace)
    preflight.output_file("--save-trace", args.save_trace)
    preflight.image_file("--gantt", args.gantt)
    model, machine = load_inputs(args)
    zoom = _zoom(args.gantt_zoom, args.steps)
    result: SimResult | DataParallelResult
    if args.nproc != 1:
        result = simulate_data_parallel(model, machine, train_config(args), args.nproc)
    else:
        result = simulate_plan(model, machine, train_config(args))
    if result.trace is not None:
        _write_outputs(args, result, zoom)
    if args.json:
        print(json_out.dumps(result.summary(), indent=2))
    elif isinstance(result, DataParallelResult):
        print(render_dp_result(result) if result.feasible else render_dp_plan(result.dp))
    elif result.feasible:
        print(render_result(result))
    else:
        print(render_plan(result.plan))
    for kind, path in (
        ("Gantt chart", args.gantt),
        ("Chrome trace", args.trace),
        ("trace", args.save_trace),
    ):
        if path and result.trace is not None and not args.json:
            print(f"{kind} written to {path}")
    return 0 if result.feasible else 1


def _zoom(text: str, steps: int) -> str | int:
    """`--gantt-zoom` checked before the simulation runs."""
    if text in ("all", "auto"):
        return text
    bad = ValueError(f"--gantt-zoom must be 'all', 'auto' or a step number 1 to {steps} "
                     f"(--steps {steps}), got {text!r}")  # fmt: skip
    try:
        step = int(text)
    except ValueError:
        raise bad from None
    if not 1 <= step <= steps:
        raise bad
    return step


def _write_outputs(
    args: argparse.Namespace, result: SimResult | DataParallelResult, zoom: str | int
) -> None:
    assert result.trace is not None
    if args.trace:
        write_atomic(args.trace, json_out.dumps(to_chrome_trace(result.trace)))
    if args.save_trace:
        write_atomic(args.save_trace, result.trace.to_json())
    if args.gantt:
        from slide.gantt import plot_gantt  # matplotlib only when a picture is asked for

        plot_gantt(result.trace, args.gantt, zoom=zoom)


def render_result(result: SimResult) -> str:
    s = result.summary()
    eta = "n/a (no decoder layer updates on the host)" if s["eta"] is None else f"{s['eta']:.2f}"
    util = ", ".join(f"{lane} {u:.0%}" for lane, u in s["lane_util"].items())
    path = ", ".join(f"{lane} {t:.3g} s" for lane, t in s["critical_path_s"].items())
    # the ledger's figure (every slot reserved before the first op, as the executor does) is the
    # one `slide plan` prints; the simulated slots in use, what the Gantt's panels draw, stay below it
    mem = ", ".join(f"{t} {b / GIB:.2f} GiB" for t, b in s["ledger"].items() if b)
    used = ", ".join(f"{t} {b / GIB:.2f}" for t, b in s["memory"].items() if b)
    return "\n".join(
        [
            f"{s['model']} on {s['machine']} ({s['schedule']}): batch {s['batch']} x seq {s['seq']}",
            *render_placement(result.plan),
            *speculation_lines(result.plan),
            f"step time      {s['step_time_s']:.3f} s (first step {s['first_step_s']:.3f} s)",
            f"eval batch     {s['eval_batch_s']:.3f} s (forward only: slide train --eval-data)",
            f"throughput     {s['tokens_per_s']:,.0f} tokens/s, {s['tflops']:.1f} TFLOP/s model "
            f"({s['tflops_6n']:.1f} at 6N, {s['tflops_8n']:.1f} at 8N)",
            f"compute-only   {s['compute_only_tokens_per_s']:,.0f} tokens/s "
            f"({s['tokens_per_s'] / s['compute_only_tokens_per_s']:.0%} reached)",
            f"eta            {eta}: T_bwd {s['t_bwd_s'] * 1e3:.1f} ms, T_d2h {s['t_d2h_s'] * 1e3:.1f} ms,"
            f" T_update {s['t_update_s'] * 1e3:.1f} ms per layer",
            f"utilisation    {util}; GPU in backward {s['gpu_bwd_util']:.0%}",
            f"bottleneck     {s['bottleneck']} (critical path: {path})",
            f"peak memory    {mem} (as planned: every slot reserved; slots in use peak at {used})",
        ]
    )
