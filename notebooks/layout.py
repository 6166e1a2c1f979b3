# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Beyond one GPU: which layout?
# For a dense model (Llama 3.1 70B on 16 H100s) and an MoE one (Qwen3-30B-A3B on 8 H200s at 128K
# tokens): which TP/PP/CP/EP layouts fit, what each GPU holds, and which is predicted fastest.
# Everything here is on paper: the memory ledger, a 1F1B step simulated with the collectives of
# each layout priced from message sizes and NCCL link rates (`slide layout`).

# %%
import matplotlib.pyplot as plt

from simulator.layout import simulate_layout
from slide_ir.layouts.cluster import load_cluster
from slide_ir.layouts.ledger import build_layout_ledger
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import Layout
from slide_ir.layouts.search import search, time_memory_front

CASES = [
    ("llama-3.1-70b", "h100-8gpu-node",
     Layout(gpus=16, seq=8192, global_batch=64, recompute=True, distributed_optimizer=True)),
    ("qwen3-30b-a3b", "h200-8gpu-node",
     Layout(gpus=8, seq=131072, global_batch=8, recompute=True, distributed_optimizer=True,
            cpu_adam=True)),
]  # fmt: skip
best = {}
for model, node, base in CASES:
    spec, cluster = load_layout_model(model), load_cluster(node)
    ranked = search(spec, base, cluster, top=5)
    print(f"{model} on {base.gpus} x {node}: {len(ranked)} best layouts that fit")
    for lay, e in ranked:
        print(f"  {lay.describe():50s} {e.tokens_per_s / lay.gpus:8.0f} tok/s/GPU  MFU {e.mfu:.0%}")
    best[model] = (spec, cluster, ranked[0][0])

# %% [markdown]
# What one GPU of the worst pipeline stage holds, per term, for the fastest layout of each:

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for ax, (model, (spec, cluster, lay)) in zip(axes, best.items(), strict=True):
    ledger = build_layout_ledger(spec, lay, cluster)
    names, sizes = zip(*ledger.gpu_terms, strict=True)
    ax.barh(names, [b / 2**30 for b in sizes])
    ax.axvline(cluster.gpu_memory_bytes / 2**30, color="k", ls="--", lw=1)
    ax.set_title(f"{model}\n{lay.describe()}", fontsize=8)
    ax.set_xlabel("GiB per GPU (dashed: capacity)")
fig.tight_layout()

# %% [markdown]
# The simulated step of the fastest MoE layout: per-dimension busy share of the links.

# %%
spec, cluster, lay = best["qwen3-30b-a3b"]
run = simulate_layout(spec, lay, cluster)
print({k: round(v, 3) for k, v in run.summary().items() if k != "comm_share"})
print("communication busy share:", {k: round(v, 3) for k, v in run.comm_share.items()})

# %% [markdown]
# Speed is not the only axis: the fastest MoE layout takes most of the GPU. The time/memory front
# (`slide layout --search --front`) keeps the fastest layout for each memory budget; the published
# starting layout for this model at 128K tokens (TP2/PP1/CP4/EP8) is one of its points.

# %%
spec, cluster, _ = best["qwen3-30b-a3b"]
front = time_memory_front(spec, CASES[1][2], cluster)
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot([b / 2**30 for *_, b in front], [e.step_s for _, e, _ in front], "o-")
for lay, e, b in front:
    ax.annotate(f"TP{lay.tp} CP{lay.cp} EP{lay.ep}", (b / 2**30, e.step_s), fontsize=7)
ax.set_xlabel("GiB per GPU")
ax.set_ylabel("predicted step (s)")
fig.tight_layout()
