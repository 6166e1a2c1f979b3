"""Closed-form step time of a layout, and the search over layouts for N GPUs.

`estimate` prices the same ops the graph holds (`LayoutCosts`) without building it. With f_s,
b_s the forward and backward of one micro-batch on stage s (compute, plus the TP and EP
collectives that block the stream, plus the part of the CP ring compute does not hide; under
recompute b_s starts with a second forward and its collectives, under selective recompute with
what its modules regenerate; both passes carry `LayoutCosts.gemm_excess`), t_pp a hop between stages,
u_s the stage's gradient sync, update and weight gather, and v chunks per stage:

    T = sum_s (f_s + b_s) / v + (m - 1/v) max_s (f_s + b_s) + 2 (p - 1) t_pp + max_s u_s

which is (m + (p - 1)/v)(f + b) for equal stages: the fill and drain of 1F1B (v = 1), v-fold
shorter when interleaved. The simulator runs the graph; a test holds the two together.
`search` enumerates TP (dividing a node), PP (dividing N; a PP that does not divide the layers
gets `balanced_split`), CP (powers of two), EP (dividing the experts), keeps the layouts that
break no rule and fit the ledger, and ranks them by `estimate`'s tokens/s (the global batch is
fixed, so this is step time): fast enough for thousands of layouts. `time_memory_front` keeps
the layouts no other beats on both step time and GPU memory: the fastest layout for each memory
budget, which is what a layout that leaves memory free (for robustness, longer sequences, or
anything the ledger does not hold) is chosen from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slide_ir.ir.graph import Op, OpKind, Work
from slide_ir.layouts.cluster import Cluster
from slide_ir.layouts.cost import LayoutCosts
from slide_ir.layouts.ledger import build_layout_ledger
from slide_ir.layouts.plan import Layout, balanced_split, layout_problems
from slide_ir.layouts.work import BF16, FP32, StageWork, all_stages, model_flops_per_step
from slide_ir.specs.model import ModelSpec

K = OpKind


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    step_s: float
    compute_s: float  # forward + backward compute of the slowest stage, all micro-batches
    comm_s: dict[str, float]  # exposed seconds per dimension on the slowest stage, per step
    update_s: float
    tokens_per_s: float
    mfu: float


def _passes(c: LayoutCosts, w: StageWork, lay: Layout) -> tuple[float, float, dict[str, float]]:
    fwd = c.compute_seconds(Work(flops=w.fwd_flops, attn_flops=w.fwd_attn_flops,
                                 bytes=w.fwd_bytes))  # fmt: skip
    fwd += c.gemm_excess(w.stage, K.FWD)
    bwd = 2 * c.compute_seconds(Work(flops=w.fwd_flops, attn_flops=w.fwd_attn_flops,
                                     bytes=w.fwd_bytes)) + c.gemm_excess(w.stage, K.BWD)  # fmt: skip
    tp = c.collective_seconds(K.ALL_REDUCE, "tp", w.tp_bytes)
    ep = c.collective_seconds(K.ALL_TO_ALL, "ep", w.ep_bytes)
    hidden = lay.cp_comm == "zigzag"  # the ring overlaps attention; the all-gather precedes it
    cp_f = max(0.0, c.collective_seconds(K.SEND_RECV, "cp", w.cp_bytes) - fwd * hidden)
    cp_b = max(0.0, c.collective_seconds(K.SEND_RECV, "cp", 2 * w.cp_bytes) - bwd * hidden)
    re = 0.0
    if lay.recompute:  # full recompute re-runs the forward and its collectives
        re = fwd + tp + ep + cp_f
    elif lay.recompute_modules:  # selective: what the modules regenerate, MoE's all-to-all
        re = c.compute_seconds(Work(flops=w.re_flops, bytes=w.re_bytes))
        re += c.gemm_excess(w.stage, K.RECOMPUTE)
        re += c.collective_seconds(K.ALL_TO_ALL, "ep", w.re_ep_bytes)
    dp_lane = 0.0  # ZeRO-3: gathers run ahead on the DP lane, with each backward's scatter
    if lay.zero >= 3:
        dp_lane = 2 * c.collective_seconds(K.ALL_GATHER, "dp", BF16 * w.dense_params)
        dp_lane += c.collective_seconds(K.REDUCE_SCATTER, "dp", FP32 * w.dense_params)
    f = fwd + tp + ep + cp_f
    b = re + bwd + tp + ep + cp_b
    dp = max(0.0, dp_lane - f - b)
    b += dp
    passes = 3 if lay.recompute else 2
    re_ep = c.collective_seconds(K.ALL_TO_ALL, "ep", w.re_ep_bytes)
    exposed = {"tp": tp * passes, "ep": ep * passes + re_ep, "cp": cp_f * (passes - 1) + cp_b,
               "dp": dp}  # fmt: skip
    return f, b, exposed


def _update(c: LayoutCosts, w: StageWork, lay: Layout) -> float:
    kind = K.REDUCE_SCATTER if lay.optimizer_shards else K.ALL_REDUCE
    sync = c.collective_seconds(kind, "dp", FP32 * w.dense_params) if lay.zero < 3 else 0.0
    sync = max(sync, c.collective_seconds(kind, "edp", FP32 * w.expert_params))
    d = lay.data_parallel * lay.cp if lay.optimizer_shards else 1
    shard = -(-w.dense_params // d) + -(-w.expert_params // (lay.expert_dp if d > 1 else 1))
    if lay.cpu_adam:
        link = c.base.rates.link
        upd = FP32 * shard / link + shard / c.host_rate + BF16 * shard / link
    else:
        adam = Op(id="u", kind=K.GPU_ADAM, lane="gpu", step=1, unit=0,
                  work=Work(elements=shard, bytes=16 * shard))  # fmt: skip
        upd = c.base.seconds(adam)
    gather = 0.0
    if lay.optimizer_shards and lay.zero < 3:
        gather = c.collective_seconds(K.ALL_GATHER, "dp", BF16 * w.dense_params)
        gather = max(gather, c.collective_seconds(K.ALL_GATHER, "edp", BF16 * w.expert_params))
    return sync + upd + gather


def estimate(spec: ModelSpec, lay: Layout, cluster: Cluster) -> Estimate:
    works = all_stages(spec, lay)
    c = LayoutCosts(cluster, lay, experts_per_token=spec.experts_per_token or 1, works=works)
    passes = [_passes(c, w, lay) for w in works]
    per_mb = [f + b for f, b, _ in passes]
    slow = max(range(len(works)), key=lambda s: per_mb[s])
    t_pp = c.collective_seconds(K.SEND_RECV, "pp", works[0].pp_bytes)
    updates = [_update(c, w, lay) for w in works]
    v = lay.virtual_stages
    fill = sum(per_mb) / v + (lay.m - 1 / v) * per_mb[slow]
    step = fill + 2 * (lay.pp - 1) * t_pp + max(updates)
    w = works[slow]
    fwd = c.compute_seconds(Work(flops=w.fwd_flops, attn_flops=w.fwd_attn_flops,
                                 bytes=w.fwd_bytes))  # fmt: skip
    compute = lay.m * fwd * (4 if lay.recompute else 3)
    if lay.recompute_modules:
        compute += lay.m * c.compute_seconds(Work(flops=w.re_flops, bytes=w.re_bytes))
    comm = {k: lay.m * v for k, v in passes[slow][2].items()}
    comm["pp"] = 2 * (lay.pp - 1) * t_pp
    tokens = lay.batch * lay.seq
    peak = cluster.machine.gpu.bf16_peak_tflops * 1e12
    return Estimate(step_s=step, compute_s=compute, comm_s=comm, update_s=updates[slow],
                    tokens_per_s=tokens / step,
                    mfu=model_flops_per_step(spec, lay) / (step * lay.gpus * peak))  # fmt: skip


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(spec: ModelSpec, base: Layout, gpus_per_node: int) -> list[Layout]:
    """Every TP/PP/CP/EP split of `base.gpus` that breaks no rule (other knobs from `base`; its
    virtual stages where PP > 1)."""
    n, out = base.gpus, []
    eps = _divisors(spec.num_experts) if spec.is_moe else [1]
    for tp in _divisors(gpus_per_node):
        for pp in (p for p in _divisors(n) if p <= spec.num_layers):
            even = spec.num_layers % pp == 0
            split = () if even else balanced_split(spec.num_layers, pp)
            v = base.virtual_stages if pp > 1 else 1
            cp = 1
            while tp * pp * cp <= n:
                if n % (tp * pp * cp) == 0:
                    dp = n // (tp * pp * cp)
                    for ep in eps:
                        lay = replace(
                            base,
                            tp=tp,
                            pp=pp,
                            cp=cp,
                            ep=ep,
                            dp=dp,
                            pp_layers=split,
                            virtual_stages=v,
                        )
                        if not layout_problems(spec, lay, gpus_per_node):
                            out.append(lay)
                cp *= 2
    return out


def search(
    spec: ModelSpec, base: Layout, cluster: Cluster, *, top: int = 10
) -> list[tuple[Layout, Estimate]]:
    """Valid layouts that fit, fastest first (at most `top`)."""
    return [(lay, e) for lay, e, _ in _fitting(spec, base, cluster)][:top]


def time_memory_front(
    spec: ModelSpec, base: Layout, cluster: Cluster
) -> list[tuple[Layout, Estimate, int]]:
    """(layout, estimate, GPU bytes) of the fitting layouts that no other fitting layout beats on
    both step time and GPU memory, fastest (and so largest) first."""
    front: list[tuple[Layout, Estimate, int]] = []
    for row in _fitting(spec, base, cluster):  # fastest first: kept if smaller than all kept
        if all(row[2] < kept[2] for kept in front):
            front.append(row)
    return front


def _fitting(spec: ModelSpec, base: Layout, cluster: Cluster) -> list[tuple[Layout, Estimate, int]]:
    """Every valid layout that fits, with its estimate and GPU bytes, fastest first (ties: the
    smaller first)."""
    rows = []
    for lay in candidates(spec, base, cluster.gpus_per_node):
        led = build_layout_ledger(spec, lay, cluster)
        if led.fits:
            rows.append((lay, estimate(spec, lay, cluster), led.gpu_bytes))
    rows.sort(key=lambda r: (-r[1].tokens_per_s, r[2]))
    return rows
