"""Predicted vs published per-GPU throughput of large training runs (`slide layout` on paper).

Each row is a published measurement with its layout; the prediction is the simulated step of
the same layout (`simulator.layout.simulate_layout`) on the catalog's node profile. Nothing is
fitted to the published figures. Prints one markdown table for bench/RESULTS.md, then how
`--search` ranks the issue's published starting layouts.

    .venv/bin/python bench/planning/layout_published.py

Sources (cited in bench/RESULTS.md):
- Llama 3 405B: Table 4 and section 3.3.2 of "The Llama 3 Herd of Models" (arXiv 2407.21783).
  126 layers on PP16 with one layer fewer on the first and last stage (7, 8 x 14, 7), an
  interleaved schedule whose V the paper does not give; "the first model chunk on the first
  stage has only the embedding" with equal chunks implies one-layer chunks, V = 8 (derived).
  FSDP sharding optimizer states and gradients, weights kept after forward (ZeRO-2 memory);
  8K sequences without activation checkpointing.
- Qwen3-235B-A22B: yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md (commit 020b813;
  256 H100, BF16; DeepEP unless "NCCL all-to-all"; recompute as the table's column gives it:
  "norm, act" as selective `layernorm moe_act`, the FSDP row's "full" as full, the TP4 row none,
  the long-context rows' command `layernorm moe`); 94 layers with embedding and
  loss counted as layers (96 = 8 x 4 chunks: 11, 12 x 6, 11 on PP8 VPP4; 32 x 3 chunks: 2,
  3 x 30, 2 on PP32 VPP3). Long-context rows give dropless and forced-balance TFLOP/s; slide
  assumes balanced routing, so both are compared.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from simulator.layout import simulate_layout
from slide_ir.layouts.cluster import Cluster, load_cluster
from slide_ir.layouts.ledger import build_layout_ledger
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import Layout, balanced_split, bubble, layout_problems
from slide_ir.layouts.search import Estimate, search, time_memory_front
from slide_ir.specs.hardware import load_gpu, load_machine
from slide_ir.specs.model import ModelSpec


@dataclass(frozen=True)
class Row:
    name: str
    model: str
    layout: Layout
    published_tflops: float  # dropless routing where the source gives both
    step_s: float | None = None  # published step time, where given
    forced_tflops: float | None = None  # with forced load balance (slide's routing assumption)


def _llama(gpus: int, cp: int, dp: int, seq: int, m: int) -> Layout:
    return Layout(gpus=gpus, tp=8, pp=16, cp=cp, dp=dp, seq=seq, micro_batches=m, zero=2,
                  pp_layers=balanced_split(126, 16), virtual_stages=8)  # fmt: skip


def _qwen(tp: int, cp: int, ep: int, dp: int, seq: int, gbs: int,
          recompute: tuple[str, ...]) -> Layout:  # fmt: skip
    return Layout(gpus=256, tp=tp, pp=8, cp=cp, ep=ep, dp=dp, seq=seq, global_batch=gbs,
                  distributed_optimizer=True, pp_layers=balanced_split(94, 8),
                  virtual_stages=4, deepep=True, recompute_modules=recompute)  # fmt: skip


# the table's "recompute" column: "norm, act" is `--recompute-modules layernorm moe_act`; the
# long-context command runs `--recompute-granularity selective --recompute-modules layernorm moe`
NORM_ACT, NORM_MOE = ("layernorm", "moe_act"), ("layernorm", "moe")


# Qwen3-235B-A22B on 256 H100 (Megatron-MoE-ModelZoo best_practice/qwen3/readme.md): every BF16
# H100 row slide can express. Left out: "+1f1b overlap" (EP all-to-all hidden behind compute,
# which slide does not model) and Qwen3-Next-80B-A3B (linear-attention layers, not modelled).
_FSDP_EP8 = Layout(gpus=256, tp=2, pp=1, ep=8, dp=128, zero=3, recompute=True,
                   micro_batch_size=4, global_batch=2048, deepep=True)  # fmt: skip
_A2A_PP32 = Layout(gpus=256, tp=2, pp=32, ep=8, dp=4, global_batch=2048,
                   distributed_optimizer=True, pp_layers=(2, *(3,) * 30, 2), virtual_stages=3,
                   recompute_modules=NORM_ACT)  # fmt: skip

ROWS = (
    Row(name="Llama 3 405B, 8K", model="llama-3.1-405b",
        layout=_llama(8192, 1, 64, 8192, 32), published_tflops=430),
    Row(name="Llama 3 405B, 8K", model="llama-3.1-405b",
        layout=_llama(16384, 1, 128, 8192, 16), published_tflops=400),
    Row(name="Llama 3 405B, 128K", model="llama-3.1-405b",
        layout=_llama(16384, 16, 8, 131072, 16), published_tflops=380),
    Row(name="Qwen3-235B-A22B, 4K, EP32 across nodes", model="qwen3-235b-a22b",
        layout=_qwen(2, 1, 32, 16, 4096, 2048, NORM_ACT), published_tflops=245, step_s=19.7),
    Row(name="Qwen3-235B-A22B, 4K, EP8 + FSDP", model="qwen3-235b-a22b",
        layout=_FSDP_EP8, published_tflops=276, step_s=17.6),
    Row(name="Qwen3-235B-A22B, 4K, EP8, NCCL all-to-all", model="qwen3-235b-a22b",
        layout=_A2A_PP32, published_tflops=200, step_s=24.2),
    Row(name="Qwen3-235B-A22B, 4K, TP4 EP8", model="qwen3-235b-a22b",
        layout=_qwen(4, 1, 8, 8, 4096, 2048, ()), published_tflops=167, step_s=29.0),
    Row(name="Qwen3-235B-A22B, 16K", model="qwen3-235b-a22b",
        layout=_qwen(4, 1, 8, 8, 16384, 256, NORM_MOE), published_tflops=237, forced_tflops=295),
    Row(name="Qwen3-235B-A22B, 32K", model="qwen3-235b-a22b",
        layout=_qwen(4, 2, 8, 4, 32768, 256, NORM_MOE), published_tflops=277, forced_tflops=335),
    Row(name="Qwen3-235B-A22B, 64K", model="qwen3-235b-a22b",
        layout=_qwen(4, 4, 8, 2, 65536, 256, NORM_MOE), published_tflops=320, forced_tflops=368),
    Row(name="Qwen3-235B-A22B, 128K", model="qwen3-235b-a22b",
        layout=_qwen(4, 8, 8, 1, 131072, 256, NORM_MOE), published_tflops=357, forced_tflops=389),
)  # fmt: skip

# The starting layouts (128K tokens, CPU Adam, recompute; 8-GPU nodes). Global batch
# (sequences per optimizer step) from THUDM/slime's RL scripts for these models: 32 in
# run-qwen3-30B-A3B.sh, 256 in run-qwen3-32B.sh, 256 in run-glm4.5-355B-A32B.sh (128 prompts x 8
# samples over 4 steps per rollout); GLM-5's RL batch is not published there: 256 assumed.
STARTING = (
    ("qwen3-30b-a3b", 8, (2, 1, 4, 8), 32),
    ("glm-4.5", 64, (8, 4, 2, 16), 256),
    ("glm-5", 256, (4, 8, 8, 32), 256),
    ("qwen3-32b", 32, (4, 2, 4, 1), 256),
)


def derated(node: Cluster) -> Cluster:
    """The node with its GPU's matmul and attention rates scaled by what our H200 calibration
    measured against the same catalog figures (layer linears vs the square-GEMM rate, SDPA vs
    the 0.55 x matmul rule): a transfer between Hopper parts, not a fit to these runs."""
    part, _ = load_gpu("h200")
    measured = load_machine("h200-16c-128g").gpu
    gpu = node.machine.gpu
    gpu = replace(
        gpu,
        bf16_matmul_tflops=gpu.bf16_matmul_tflops
        * measured.bf16_matmul_tflops
        / part.bf16_matmul_tflops,
        attention_tflops=gpu.attention_tflops * measured.attention_tflops / part.attention_tflops,
    )
    # the SDPA probe ran (4, 32, 2048, 128): its rate stands for 2K-token kernels
    return replace(node, machine=replace(node.machine, gpu=gpu), attention_ref_seq=2048)


def table() -> list[str]:
    node = load_cluster("h100-8gpu-node")
    slow = derated(node)
    out = ["| run | GPUs | TP | CP | PP (v) | EP | DP | seq | m | published TFLOP/s/GPU | "
           "predicted, catalog rates | error | with H200-measured kernel ratios | error | "
           "error vs forced balance | fits 80 GB (GiB) |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for row in ROWS:
        spec, lay = load_layout_model(row.model), row.layout
        problems = layout_problems(spec, lay, node.gpus_per_node)
        if problems:
            raise SystemExit(f"{row.name}: {problems[0]}")
        plain = simulate_layout(spec, lay, node)
        cal = simulate_layout(spec, lay, slow)
        led = build_layout_ledger(spec, lay, node)
        published = f"{row.published_tflops:.0f}"
        if row.step_s:
            tokens = lay.batch * lay.seq / row.step_s / lay.gpus
            published += f" ({tokens:.0f} vs {cal.tokens_per_s_per_gpu:.0f} tokens/s/GPU)"
        forced = "-"
        if row.forced_tflops:
            forced = (
                f"{cal.tflops_per_gpu / row.forced_tflops - 1:+.1%} (of {row.forced_tflops:.0f})"
            )
        out.append(
            f"| {row.name} | {lay.gpus:,} | {lay.tp} | {lay.cp} | {lay.pp} ({lay.virtual_stages}) | "
            f"{lay.ep} | {lay.data_parallel} | {lay.seq:,} | {lay.m} | {published} | "
            f"{plain.tflops_per_gpu:.0f} | {plain.tflops_per_gpu / row.published_tflops - 1:+.1%} | "
            f"{cal.tflops_per_gpu:.0f} | {cal.tflops_per_gpu / row.published_tflops - 1:+.1%} | "
            f"{forced} | {'yes' if led.fits else 'no'} ({led.gpu_bytes / 2**30:.0f}) |"
        )
    return out


def _terms(spec: ModelSpec, lay: Layout, e: Estimate, node: Cluster) -> str:
    comm = ", ".join(f"{k} {v:.1f}" for k, v in e.comm_s.items() if v >= 0.05)
    gib = build_layout_ledger(spec, lay, node).gpu_bytes / 2**30
    return (f"{e.step_s:.1f} s: compute {e.compute_s:.1f}, exposed {comm or 'none'}, bubble "
            f"{bubble(lay.pp, lay.m, lay.virtual_stages):.1%}, update {e.update_s:.1f}; {gib:.0f} GiB")  # fmt: skip


def _front_cell(spec: ModelSpec, base: Layout, node: Cluster, dims: tuple[int, ...]) -> str:
    """Where the published layout stands on the time/memory front, or what beats it on both."""
    front = time_memory_front(spec, base, node)
    at = [i for i, (x, _, _) in enumerate(front) if (x.tp, x.pp, x.cp, x.ep) == dims]
    if at:
        return f"on it, {at[0] + 1} of {len(front)}"
    mine = next((x, e) for x, e in search(spec, base, node, top=100_000)
            if (x.tp, x.pp, x.cp, x.ep) == dims)  # fmt: skip
    gib = build_layout_ledger(spec, mine[0], node).gpu_bytes
    better = [r for r in front if r[1].step_s <= mine[1].step_s and r[2] <= gib][-1]
    return (f"no: {better[0].describe()} is {1 - better[1].step_s / mine[1].step_s:.1%} faster "
            f"in {better[2] / 2**30:.0f} GiB")  # fmt: skip


def ranks(node_name: str) -> list[str]:
    node = load_cluster(node_name)
    out = ["| model | GPUs | published layout | rank (plain all-to-all) | rank (--deepep) | "
           "time/memory front (plain) | time/memory front (--deepep) | its tokens/s/GPU | best | "
           "best layout (plain) | published: step | best: step |",
           "|---|---:|---|---|---|---|---|---:|---:|---|---|---|"]  # fmt: skip
    for model, gpus, dims, batch in STARTING:
        spec = load_layout_model(model)
        cells, fronts = [], []
        for deepep in (False, True):
            base = Layout(gpus=gpus, seq=131072, cpu_adam=True, recompute=True,
                          distributed_optimizer=True, global_batch=batch, deepep=deepep)  # fmt: skip
            ranked = search(spec, base, node, top=100_000)
            at = [i for i, (x, _) in enumerate(ranked) if (x.tp, x.pp, x.cp, x.ep) == dims]
            cells.append((at[0] if at else None, ranked))
            fronts.append(_front_cell(spec, base, node, dims) if at else "-")
        (i, ranked), (j, _) = cells
        mine, best = ranked[i] if i is not None else None, ranked[0]
        out.append(
            f"| {model} | {gpus} | TP{dims[0]}/PP{dims[1]}/CP{dims[2]}/EP{dims[3]} | "
            f"{'-' if i is None else i + 1} of {len(ranked)} | "
            f"{'-' if j is None else j + 1} of {len(cells[1][1])} | {fronts[0]} | {fronts[1]} | "
            f"{mine[1].tokens_per_s / gpus if mine else 0:.0f} | "
            f"{best[1].tokens_per_s / gpus:.0f} | {best[0].describe()} | "
            f"{_terms(spec, mine[0], mine[1], node) if mine else '-'} | "
            f"{_terms(spec, best[0], best[1], node)} |"
        )
    return out


if __name__ == "__main__":
    print("\n".join(table()))
    if "--ranks" in sys.argv:
        for name in ("h200-8gpu-node", "h100-8gpu-node"):
            print(f"\n{name}:")
            print("\n".join(ranks(name)))
