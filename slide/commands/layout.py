"""`slide layout`: a multi-GPU layout on paper: per-GPU ledger, verdict, advice, a simulated
1F1B step; or `--search` over the valid layouts for N GPUs, ranked by predicted throughput."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from simulator.layout import simulate_layout
from slide import json_out
from slide.errors import UserError
from slide_ir.layouts.cluster import Cluster, cluster_names, load_cluster
from slide_ir.layouts.ledger import advice, build_layout_ledger
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import CP_COMMS, RECOMPUTE_MODULES, Layout, check_layout
from slide_ir.layouts.search import search, time_memory_front
from slide_ir.specs.model import ModelSpec

NAME = "layout"
HELP = "plan a TP/PP/CP/EP/DP layout over several GPUs: memory per GPU, fit, predicted step"
GIB = 2**30


def add_cluster_arguments(parser: argparse.ArgumentParser, gpus_help: str) -> None:
    """--model, --gpus and --machine, as `slide layout` and `slide rollout` take them."""
    parser.add_argument("--model", required=True, help="catalog name (dense or MoE) or config")
    parser.add_argument("--gpus", type=int, required=True, help=gpus_help)
    parser.add_argument("--machine", default="h200-8gpu-node",
                        help=f"cluster node: {', '.join(cluster_names())} [h200-8gpu-node]")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser, "number of GPUs N")
    for dim in ("tp", "pp", "cp", "ep"):
        parser.add_argument(f"--{dim}", type=int, default=1, help=f"{dim.upper()} size [1]")
    parser.add_argument("--dp", type=int, default=0, help="DP size [N / (TP PP CP)]")
    parser.add_argument("--pp-layers", default="", metavar="N,N,...",
                        help="decoder layers per pipeline stage, e.g. 9,10,10,10,10,10,10,9 "
                        "[L / PP each]")  # fmt: skip
    parser.add_argument("--virtual-stages", type=int, default=1, metavar="V",
                        help="model chunks per stage: interleaved 1F1B, bubble "
                        "(PP-1)/(V m + PP-1) [1: plain 1F1B]")  # fmt: skip
    opt = parser.add_mutually_exclusive_group()
    opt.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 over DP [0]")
    opt.add_argument("--distributed-optimizer", action="store_true",
                     help="shard master + moments and the update, gather weights (ZeRO-1 memory)")  # fmt: skip
    parser.add_argument("--cpu-adam", action="store_true", help="master + moments on the host")
    recompute = parser.add_mutually_exclusive_group()
    recompute.add_argument("--recompute", action="store_true", help="full activation recompute")
    recompute.add_argument("--recompute-modules", nargs="+", choices=RECOMPUTE_MODULES, default=(),
                           metavar="MODULE", help="selective recompute, as Megatron's: "
                           f"{', '.join(RECOMPUTE_MODULES)} [none]")  # fmt: skip
    parser.add_argument("--deepep", action="store_true",
                        help="EP dispatch deduplicated per node (DeepEP): a token crosses to each "
                        "remote node once")  # fmt: skip
    parser.add_argument("--cp-comm", choices=CP_COMMS, default="zigzag",
                        help="how CP ranks share K/V: zigzag ring (overlapped) or allgather "
                        "(contiguous chunks, whole K/V gathered) [zigzag]")  # fmt: skip
    parser.add_argument("--micro-batches", type=int, default=0, help="m per step [PP]")
    parser.add_argument("--micro-batch-size", type=int, default=1, help="sequences [1]")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length [4096]")
    parser.add_argument("--global-batch", type=int, default=0,
                        help="sequences per step [m x DP x micro-batch; --search: N]")  # fmt: skip
    parser.add_argument("--search", action="store_true", help="rank every valid layout that fits")
    parser.add_argument("--top", type=int, default=8, help="layouts --search shows [8]")
    parser.add_argument("--front", action="store_true",
                        help="with --search: only the layouts no other beats on both step time "
                        "and GPU memory (the fastest for each memory budget)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _stage_list(text: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--pp-layers takes layer counts like 8,8,7; got {text!r}") from None
    if any(n < 1 for n in sizes):
        raise UserError(f"--pp-layers: every stage needs >= 1 layer; got {text!r}")
    return sizes


def _layout(args: argparse.Namespace) -> Layout:
    return Layout(
        gpus=args.gpus, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, dp=args.dp,
        zero=args.zero, distributed_optimizer=args.distributed_optimizer,
        cpu_adam=args.cpu_adam, recompute=args.recompute,
        recompute_modules=tuple(args.recompute_modules), seq=args.seq,
        micro_batch_size=args.micro_batch_size, global_batch=args.global_batch,
        micro_batches=args.micro_batches, pp_layers=_stage_list(args.pp_layers),
        virtual_stages=args.virtual_stages, deepep=args.deepep, cp_comm=args.cp_comm,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    spec, cluster = load_layout_model(args.model), load_cluster(args.machine)
    lay = _layout(args)
    if args.search:
        out = _search(spec, replace(lay, global_batch=lay.global_batch or lay.gpus), cluster, args)
    else:
        out = _plan(spec, lay, cluster)
    print(json_out.dumps(out, indent=2) if args.json else render(out))
    # as `slide plan`: a layout that does not fit (or a search where none does) is exit 1
    return 0 if out.get("fits", True) and out.get("search", True) else 1


def _plan(spec: ModelSpec, lay: Layout, cluster: Cluster) -> dict[str, Any]:
    check_layout(spec, lay, cluster.gpus_per_node)
    led = build_layout_ledger(spec, lay, cluster)
    out: dict[str, Any] = {
        "model": spec.name, "machine": cluster.name, "layout": lay.describe(),
        "gpu_terms": dict(led.gpu_terms), "gpu_bytes": led.gpu_bytes,
        "gpu_capacity": led.gpu_capacity, "worst_stage": led.stage,
        "in_flight_micro_batches": led.in_flight, "virtual_stages": lay.virtual_stages,
        "host_per_node": led.host_per_node,
        "host_capacity": led.host_capacity, "fits": led.fits,
    }  # fmt: skip
    if not led.fits:
        out["advice"] = advice(spec, lay, cluster)
        return out
    out["predicted"] = simulate_layout(spec, lay, cluster).summary()
    return out


def _search(
    spec: ModelSpec, base: Layout, cluster: Cluster, args: argparse.Namespace
) -> dict[str, Any]:
    if args.top < 1:
        raise UserError(f"--top must be >= 1; got {args.top}")
    if args.front:
        ranked = time_memory_front(spec, base, cluster)
    else:
        ranked = [(lay, e, build_layout_ledger(spec, lay, cluster).gpu_bytes)
                  for lay, e in search(spec, base, cluster, top=args.top)]  # fmt: skip
    rows = [
        {"layout": lay.describe(), "tokens_per_s_per_gpu": e.tokens_per_s / lay.gpus,
         "step_time_s": e.step_s, "mfu": e.mfu, "exposed_comm_s": e.comm_s,
         "gpu_gib": gpu_bytes / GIB}
        for lay, e, gpu_bytes in ranked
    ]  # fmt: skip
    return {"model": spec.name, "machine": cluster.name, "gpus": base.gpus,
            "global_batch": base.batch, "seq": base.seq, "front": args.front,
            "search": rows}  # fmt: skip


def render(out: dict[str, Any]) -> str:
    if "search" in out:
        what = ("the fastest layout for each GPU memory budget" if out.get("front")
                else "layouts that fit")  # fmt: skip
        lines = [f"{out['model']} on {out['gpus']} GPUs ({out['machine']}), global batch "
                 f"{out['global_batch']} x {out['seq']}: {what}, fastest first"]  # fmt: skip
        for i, r in enumerate(out["search"], 1):
            comm = ", ".join(f"{k} {v:.2f}s" for k, v in r["exposed_comm_s"].items() if v > 0)
            lines.append(f"{i:2d}. {r['layout']:48s} {r['tokens_per_s_per_gpu']:9.0f} tok/s/GPU  "
                         f"MFU {r['mfu']:.0%}  {r['gpu_gib']:.0f} GiB  exposed comm: {comm or 'none'}")  # fmt: skip
        return "\n".join(lines if out["search"] else [*lines, "  none fits"])
    lines = [f"{out['model']} on {out['machine']}: {out['layout']}",
             f"per GPU (stage {out['worst_stage']}, {out['in_flight_micro_batches']} "
             f"{'micro-batches' if out['virtual_stages'] == 1 else 'model chunks'} in flight):"]  # fmt: skip
    lines += [f"  {k:13s} {v / GIB:8.1f} GiB" for k, v in out["gpu_terms"].items()]
    lines.append(
        f"  {'total':13s} {out['gpu_bytes'] / GIB:8.1f} GiB of {out['gpu_capacity'] / GIB:.1f}"
    )
    lines.append(f"host RAM per node: {out['host_per_node'] / GIB:.0f} GiB of "
                 f"{out['host_capacity'] / GIB:.0f}")  # fmt: skip
    lines.append("verdict: fits" if out["fits"] else "verdict: does not fit")
    lines += [f"  try {a}" for a in out.get("advice", [])]
    if "predicted" in out:
        p = out["predicted"]
        comm = ", ".join(f"{k} {v:.0%}" for k, v in p["comm_share"].items())
        lines.append(f"predicted step {p['step_time_s']:.3f} s, {p['tokens_per_s_per_gpu']:.0f} "
                     f"tokens/s/GPU, MFU {p['mfu']:.1%}, bubble {p['bubble']:.1%}, "
                     f"communication busy: {comm or 'none'}")  # fmt: skip
    return "\n".join(lines)
