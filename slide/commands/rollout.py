"""`slide rollout`: the rollout side of RL training on paper: an inference engine's memory per GPU
(weights, KV cache, workspace, reserve), its verdict with advice, the predicted round time; with
the training layout, the RL step on co-located or split pools; or `--search` over both."""

from __future__ import annotations

import argparse
from typing import Any

from slide import json_out
from slide.commands.layout import add_cluster_arguments
from slide.errors import UserError
from slide_ir.layouts.cluster import Cluster, load_cluster
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import CP_COMMS, Layout
from slide_ir.layouts.pools import (
    PoolPlan,
    check_training,
    colocated,
    search_pools,
    split,
    training_layout,
)
from slide_ir.layouts.rollout import (
    KV_DTYPES,
    Engine,
    EngineLedger,
    RolloutWork,
    build_engine_ledger,
    check_engine,
    engine_advice,
)
from slide_ir.layouts.rollout_cost import RolloutTime, rollout_time
from slide_ir.specs.model import ModelSpec

NAME = "rollout"
HELP = "size rollout engines (KV cache, fit, round time) and co-located vs split RL pools"
GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser, "GPUs N of the whole job")
    eng = parser.add_argument_group("engine")
    eng.add_argument("--engine-gpus", type=int, default=8, help="GPUs per engine G [8]")
    eng.add_argument("--engine-tp", type=int, default=0, help="attention TP [min(G, node)]")
    eng.add_argument("--engine-ep", type=int, default=0, help="expert parallel [G MoE, 1 dense]")
    eng.add_argument("--kv-dtype", choices=tuple(KV_DTYPES), default="bf16", help="[bf16]")
    work = parser.add_argument_group("rollout round")
    work.add_argument("--prompts", type=int, default=8, help="prompts per round [8]")
    work.add_argument("--samples", type=int, default=8, help="samples per prompt [8]")
    work.add_argument("--prompt-len", type=int, default=2048, help="prompt tokens [2048]")
    work.add_argument("--response-len", type=int, default=8192, help="response tokens [8192]")
    work.add_argument("--concurrency", type=int, default=0,
                      help="sequences in flight per engine [as many as the KV holds]")  # fmt: skip
    pools = parser.add_argument_group("pools and training layout")
    pools.add_argument("--engine-only", action="store_true",
                       help="only the engines on all N GPUs, no training side")  # fmt: skip
    pools.add_argument("--rollout-gpus", type=int, default=0,
                       help="split pools: GPUs for the engines, the rest train [0: co-located]")  # fmt: skip
    for dim in ("tp", "pp", "cp", "ep"):
        pools.add_argument(f"--{dim}", type=int, default=1, help=f"training {dim.upper()} [1]")
    pools.add_argument("--cp-comm", choices=CP_COMMS, default="zigzag", help="[zigzag]")
    pools.add_argument("--distributed-optimizer", action="store_true", help="shard the optimizer")
    pools.add_argument("--cpu-adam", action="store_true", help="master + moments on the host")
    pools.add_argument("--recompute", action="store_true", help="full activation recompute")
    parser.add_argument("--search", action="store_true",
                        help="rank co-located and split plans for N GPUs, every valid engine")  # fmt: skip
    parser.add_argument("--top", type=int, default=8, help="plans --search shows [8]")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _engine(args: argparse.Namespace, spec: ModelSpec, cluster: Cluster) -> Engine:
    g = args.engine_gpus
    tp = args.engine_tp or min(g, cluster.gpus_per_node)
    ep = args.engine_ep or (g if spec.is_moe else 1)
    return Engine(gpus=g, tp=tp, ep=ep, kv_dtype=args.kv_dtype)


def _work(args: argparse.Namespace) -> RolloutWork:
    return RolloutWork(prompts=args.prompts, samples=args.samples, prompt_len=args.prompt_len,
                       response_len=args.response_len, concurrency=args.concurrency)  # fmt: skip


def _layout(args: argparse.Namespace, gpus: int) -> Layout:
    return Layout(gpus=gpus, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep,
                  cp_comm=args.cp_comm, distributed_optimizer=args.distributed_optimizer,
                  cpu_adam=args.cpu_adam, recompute=args.recompute)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    spec, cluster = load_layout_model(args.model), load_cluster(args.machine)
    work, n = _work(args), args.gpus
    if n < 1:
        raise UserError(f"--gpus must be >= 1; got {n}")
    if args.search:
        out = _search(spec, args, work, cluster)
    else:
        eng = _engine(args, spec, cluster)
        out = _plan(spec, args, eng, work, cluster)
    print(json_out.dumps(out, indent=2) if args.json else render(out))
    return 0


def _plan(
    spec: ModelSpec, args: argparse.Namespace, eng: Engine, work: RolloutWork, cluster: Cluster
) -> dict[str, Any]:
    n, roll = args.gpus, args.rollout_gpus
    if roll and not 0 < roll < n:
        raise UserError(f"--rollout-gpus must be between 1 and --gpus - 1 = {n - 1}; got {roll}")
    pool = roll or n
    check_engine(spec, eng, pool, cluster.gpus_per_node)
    led = build_engine_ledger(spec, eng, work, cluster, pool // eng.gpus)
    out = {"model": spec.name, "machine": cluster.name, "gpus": n,
           **_engine_dict(led, eng, pool, rollout_time(spec, eng, work, cluster, pool // eng.gpus, led))}  # fmt: skip
    if not led.fits:
        out["advice"] = engine_advice(spec, eng, work, cluster, pool)
    if args.engine_only or not led.fits:
        return out
    lay = training_layout(_layout(args, n - roll), work, n - roll)
    check_training(spec, lay, cluster)
    plan = (
        split(spec, lay, eng, work, cluster, roll)
        if roll
        else colocated(spec, lay, eng, work, cluster)
    )
    out["pools"] = _pool_dict(plan)
    return out


def _engine_dict(led: EngineLedger, eng: Engine, pool: int, t: RolloutTime) -> dict[str, Any]:
    return {
        "engine": eng.describe(), "rollout_gpus": pool, "engines": pool // eng.gpus,
        "engine_terms": dict(led.gpu_terms), "engine_bytes": led.gpu_bytes,
        "gpu_capacity": led.gpu_capacity, "fits": led.fits, "overflow": led.overflow(),
        "kv_per_sequence": led.kv_per_sequence, "batch": led.batch,
        "requested": led.requested, "max_batch": led.max_batch,
        "round": {"prefill_s": t.prefill_s, "decode_s": t.decode_s, "round_s": t.round_s,
                  "waves": t.waves, "decode_step_s": t.step_s, "bound": t.bound,
                  "decode_tokens_per_s_per_gpu": t.decode_tokens_per_s_per_gpu},
    }  # fmt: skip


def _pool_dict(p: PoolPlan) -> dict[str, Any]:
    return {
        "mode": p.mode, "layout": p.layout.describe(), "train_gpus": p.layout.gpus,
        "rollout_gpus": p.rollout_gpus, "engine": p.engine.describe(),
        "train_bytes": p.train.gpu_bytes, "rollout_bytes": p.rollout.gpu_bytes,
        "resident": dict(p.resident), "phases": dict(p.phases), "peak_bytes": p.peak_bytes,
        "host_per_node": p.host_per_node, "host_capacity": p.train.host_capacity,
        "fits": p.fits, "rollout_s": p.times.round_s, "train_s": p.train_s,
        "switch_s": p.switch_s, "sync_s": p.sync_s, "step_s": p.step_s,
        "overlapped_s": p.overlapped_s,
    }  # fmt: skip


def _search(
    spec: ModelSpec, args: argparse.Namespace, work: RolloutWork, cluster: Cluster
) -> dict[str, Any]:
    if args.top < 1:
        raise UserError(f"--top must be >= 1; got {args.top}")
    base = _layout(args, args.gpus)
    plans = search_pools(spec, base, work, cluster, args.gpus, kv_dtype=args.kv_dtype, top=args.top)
    return {"model": spec.name, "machine": cluster.name, "gpus": args.gpus,
            "sequences": work.sequences, "context": work.context,
            "search": [_pool_dict(p) for p in plans]}  # fmt: skip


def render(out: dict[str, Any]) -> str:
    if "search" in out:
        lines = [f"{out['model']} on {out['gpus']} GPUs ({out['machine']}), {out['sequences']} "
                 f"sequences of {out['context']} tokens: plans that fit, fastest step first"]  # fmt: skip
        lines += [f"{i:2d}. {_pool_line(p)}" for i, p in enumerate(out["search"], 1)]
        return "\n".join(lines if out["search"] else [*lines, "  none fits"])
    lines = [f"{out['model']} on {out['machine']}: {out['engines']} x {out['engine']}",
             f"per engine GPU ({out['batch']} of {out['requested']} sequences in flight, "
             f"KV {out['kv_per_sequence'] / GIB:.2f} GiB per sequence per GPU):"]  # fmt: skip
    lines += [f"  {k:10s} {v / GIB:8.1f} GiB" for k, v in out["engine_terms"].items()]
    lines.append(f"  {'total':10s} {out['engine_bytes'] / GIB:8.1f} GiB of "
                 f"{out['gpu_capacity'] / GIB:.1f}")  # fmt: skip
    lines.append("verdict: fits" if out["fits"] else f"verdict: does not fit: {out['overflow']}")
    lines += [f"  try {a}" for a in out.get("advice", [])]
    r = out["round"]
    lines.append(f"round: prefill {r['prefill_s']:.2f} s + decode {r['decode_s']:.1f} s in "
                 f"{r['waves']} wave(s), step {r['decode_step_s'] * 1e3:.1f} ms ({r['bound']}-"
                 f"bound), {r['decode_tokens_per_s_per_gpu']:.0f} decode tokens/s/GPU")  # fmt: skip
    if "pools" in out:
        p = out["pools"]
        phases = ", ".join(f"{k} {v / GIB:.1f}" for k, v in p["phases"].items())
        lines += [_pool_line(p), f"  GPU GiB per phase: {phases}; host per node "
                  f"{p['host_per_node'] / GIB:.0f} of {p['host_capacity'] / GIB:.0f} GiB"]  # fmt: skip
    return "\n".join(lines)


def _pool_line(p: dict[str, Any]) -> str:
    where = (f"{p['train_gpus']} train + {p['rollout_gpus']} rollout" if p["mode"] == "split"
             else f"{p['train_gpus']} shared")  # fmt: skip
    return (f"{p['mode']} ({where}): {p['layout']} | {p['engine']} | step {p['step_s']:.0f} s = "
            f"rollout {p['rollout_s']:.0f} + train {p['train_s']:.0f} + switch "
            f"{p['switch_s']:.1f} + sync {p['sync_s']:.1f}; peak {p['peak_bytes'] / GIB:.0f} GiB"
            f"{'' if p['fits'] else ' (does not fit)'}")  # fmt: skip
