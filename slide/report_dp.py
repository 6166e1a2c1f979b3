"""Data-parallel plans and predictions as text and JSON (`slide plan/simulate --nproc N`).

Memory is given where it is bounded: the GPU per rank, host RAM and NVMe per host (every rank
of the node together). The single-GPU report (`slide.report`) is unchanged and used for N = 1.
"""

from __future__ import annotations

import math
from typing import Any

from simulator.data_parallel import DataParallelResult
from slide.report import overflow_text, plan_summary, render_placement
from slide_ir.ir.graph import OpKind
from slide_ir.planning.data_parallel import DataParallelPlan
from slide_ir.planning.ledger import REPORT_TIERS
from slide_ir.specs.hardware_parts import GIB

GB = 1e9  # bytes moved per step, beside the GB/s they move at; sizes held are GiB


def dp_plan_summary(dp: DataParallelPlan) -> dict[str, Any]:
    """`plan_summary` of one rank's plan (its batch the rank's), plus `data_parallel`: per-rank
    and per-host memory, with each term's bytes per rank, and the net lane's traffic."""
    out = plan_summary(dp.base)
    out["feasible"] = dp.feasible
    out["overflows"] = dict(dp.overflows())
    out["data_parallel"] = {
        **dp.summary(),
        "terms": [
            {
                "name": t.name,
                "label": t.label,
                "tier": t.tier,
                "bytes_per_rank": t.bytes,
                "bytes_single_gpu": t.single,
            }
            for t in dp.terms
        ],
        "collectives": _collective_bytes(dp),
    }
    return out


def _collective_bytes(dp: DataParallelPlan) -> dict[str, int]:
    """Ring message bytes per step by kind (every rank's shard together)."""
    out: dict[str, int] = {}
    for op in dp.graph.ops:
        if op.lane == "net":
            out[str(op.kind)] = out.get(str(op.kind), 0) + op.work.bytes
    steps = max(1, dp.graph.info.steps)
    return {k: b // steps for k, b in out.items()}


def render_dp_plan(dp: DataParallelPlan) -> str:
    p, n = dp.base, dp.nproc
    c, m = p.config, p.model
    lines = [
        f"{m.name} ({m.total_params / 1e9:.2f} B params, {m.num_layers} layers) on "
        f"{p.machine.name}: {n} data-parallel ranks on one node",
        f"schedule {c.schedule}: global batch {dp.global_batch} = {n} ranks x batch {c.batch}, "
        f"seq {c.seq} x accum {c.grad_accum} = {n * c.tokens_per_step:,} tokens/step; "
        f"activations on {c.activations}, optimizer state sharded 1/{n} per rank",
        *(f"rank {line}" for line in render_placement(p)[:1]),
        f"interconnect {_interconnect(dp)}",
        "",
    ]
    lines += _memory_lines(dp)
    lines.append("")
    if dp.feasible:
        lines.append("verdict: fits")
    else:
        lines.append(
            f"verdict: does not fit ({overflow_text(dp.overflows())}). What would make it fit:"
        )
        lines += [f"  - {s}" for s in _dp_fixes(dp)]
    messages = _collective_bytes(dp)
    rs, ag = messages.get(OpKind.REDUCE_SCATTER, 0), messages.get(OpKind.ALL_GATHER, 0)
    lines.append(
        f"net lane: reduce-scatter {rs / GB:.2f} GB + all-gather {ag / GB:.2f} GB per step "
        f"(ring messages); each rank sends {dp.net_bytes_per_step() / GB:.2f} GB per step"
    )
    per_lane = ", ".join(f"{lane} {k}" for lane, k in dp.graph.ops_per_lane().items())
    lines.append(f"graph (rank 0): {len(dp.graph.ops)} ops over {c.steps} steps ({per_lane})")
    return "\n".join(lines)


def _dp_fixes(dp: DataParallelPlan) -> list[str]:
    """Each overflowing tier's size that holds the run (the host's for all ranks together)."""
    margin = dp.base.config.host_margin
    out = []
    for tier, over in dp.overflows():
        need = (dp.capacity_bytes(tier) + over) / GIB
        if tier == "gpu":
            out.append(f"GPUs with at least {need:.1f} GiB each, or a smaller --batch")
        elif tier == "cpu":
            ram = math.ceil(need / (1.0 - margin))
            out.append(
                f"more host RAM for the {dp.nproc} ranks: at least {ram} GiB (--ram-gb {ram})"
            )
        else:
            out.append(f"more NVMe capacity: {need:.0f} GiB for the {dp.nproc} ranks")
    return out


def _interconnect(dp: DataParallelPlan) -> str:
    mach = dp.base.machine
    rate = mach.peer_bytes_per_s / GB
    if mach.gpu.nvlink_bytes_per_s:
        return f"NVLink, {rate:.0f} GB/s per GPU each way (ring collectives)"
    return f"PCIe peer-to-peer, {rate:.1f} GB/s per GPU each way (the host link; no NVLink)"


def _memory_lines(dp: DataParallelPlan) -> list[str]:
    n, lines = dp.nproc, []
    for tier in REPORT_TIERS:
        rank, cap = dp.rank_bytes(tier), dp.capacity_bytes(tier)
        if not rank and not cap:
            continue
        use = rank if tier == "gpu" else n * rank
        where = "per rank" if tier == "gpu" else f"per host ({n} x {rank / GIB:.1f} GiB)"
        mark = "ok" if use <= cap else f"OVER by {(use - cap) / GIB:.1f} GiB"
        lines.append(
            f"{tier.upper():5s} {use / GIB:8.2f} GiB of {cap / GIB:.1f} GiB {where}  {mark}"
        )
        sizes: dict[str, tuple[int, int]] = {}
        for t in dp.terms:
            if t.tier == tier:
                a, b = sizes.get(t.label, (0, 0))
                sizes[t.label] = (a + t.bytes, b + t.single)
        for label, (size, single) in sorted(sizes.items(), key=lambda kv: -kv[1][0]):
            note = f"  (one GPU: {single / GIB:.2f})" if size != single else ""
            lines.append(f"      {label:48s} {size / GIB:8.2f} GiB per rank{note}")
    return lines


def render_dp_result(result: DataParallelResult) -> str:
    s, dp = result.summary(), result.dp
    d = s["data_parallel"]
    util = ", ".join(f"{lane} {u:.0%}" for lane, u in s["lane_util"].items())
    path = ", ".join(f"{lane} {t:.3g} s" for lane, t in s["critical_path_s"].items())
    return "\n".join(
        [
            f"{s['model']} on {s['machine']} ({s['schedule']}, {dp.nproc} data-parallel ranks): "
            f"global batch {s['batch']} ({dp.nproc} x {d['rank_batch']}) x seq {s['seq']}",
            *(f"rank {line}" for line in render_placement(dp.base)[:1]),
            f"step time      {s['step_time_s']:.3f} s (first step {s['first_step_s']:.3f} s)",
            f"throughput     {s['tokens_per_s']:,.0f} tokens/s for the global batch, "
            f"{s['tflops']:.1f} TFLOP/s model per GPU",
            f"interconnect   {_interconnect(dp)}; net lane busy {d['net_util'] or 0:.0%}, "
            f"{d['net_bytes_per_step'] / GB:.2f} GB sent per rank per step",
            f"utilisation    {util} (rank 0); GPU in backward {s['gpu_bwd_util']:.0%}",
            f"bottleneck     {s['bottleneck']} (critical path: {path})",
            f"memory         GPU {d['gpu_bytes_per_rank'] / GIB:.1f} GiB per rank, host RAM "
            f"{d['host_bytes_per_host'] / GIB:.1f} GiB per host (ledger)",
        ]
    )
