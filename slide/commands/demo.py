"""`slide demo`: the README's main command. Plans and simulates a default model on a default
machine (the SlideFormer paper's RTX 4090 PC) and writes the Gantt chart and the Chrome trace; on a
CUDA machine it also fine-tunes the built-in tiny-llama from a plan and draws the measured Gantt
beside the predicted one."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from simulator.run import simulate_plan
from slide import json_out
from slide.commands.simulate import render_result
from slide.fileio import write_atomic
from slide.report import overflow_text
from slide_ir.ir.trace import to_chrome_trace
from slide_ir.planning.planner import plan_to_json
from slide_ir.specs.config import TrainConfig

NAME = "demo"
HELP = (
    "plan + simulate llama-3.1-8b on paper-pc-4090; on a CUDA machine, also a real tiny fine-tune"
)
MODEL, MACHINE = "llama-3.1-8b", "paper-pc-4090"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="out/demo", help="output directory [out/demo]")
    parser.add_argument("--batch", type=int, default=16, help="micro-batch size [16]")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    # train's defaults (global clipping), so that the demo says what `slide simulate` says
    config = TrainConfig(batch=args.batch, seq=1024, steps=3, clip="global")
    result = simulate_plan(MODEL, MACHINE, config)
    if result.trace is None:
        raise ValueError(
            f"the demo plan at batch {args.batch} does not fit {MACHINE} "
            f"({overflow_text(result.plan.ledger.overflows())}): try a smaller --batch"
        )
    write_atomic(out / "plan.json", plan_to_json(result.plan))
    write_atomic(out / "trace.json", json_out.dumps(to_chrome_trace(result.trace)))
    from slide.gantt import plot_gantt

    plot_gantt(result.trace, out / "gantt.png", zoom="auto")
    print(render_result(result))
    print(f"\nplan        {out / 'plan.json'}")
    print(f"Gantt chart {out / 'gantt.png'}")
    print(f"Chrome trace {out / 'trace.json'} (open in https://ui.perfetto.dev)")
    reason = _no_real_run_reason()
    if reason:
        print(f"\nskipped the real fine-tune of tiny-llama: {reason}")
        return 0
    from slide.training import demo_finetune

    print("\n" + demo_finetune(out / "tiny-llama"))
    return 0


def _no_real_run_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed here (the demo environment is the lean planning install)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device on this machine"
    return None
