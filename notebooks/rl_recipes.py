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
# # RL recipes: do training and rollouts fit on the same GPUs?
# The RL layout guide's four starting recipes, sized on 8-GPU H200 nodes: the training layout
# (`slide layout`'s ledger and step estimate) and the rollout engines (`slide rollout`: weights,
# KV cache for 8 prompts x 8 samples of 2K-token prompts and 128K-token responses, workspace,
# reserve) co-located on one pool, with the switch between them and the weight sync.
# Everything is on paper. CPU Adam and recompute are on for every recipe, as the guide has them.
#
# The guide's 27B dense recipe is a Qwen model; Qwen3.5-27B mixes Gated DeltaNet and attention
# layers, which the planner's `ModelSpec` cannot describe (its layers are identical), so the
# closest dense Qwen of the catalog, Qwen3-32B (64 layers, 8 KV heads), stands in for it.

# %%
import matplotlib.pyplot as plt

from slide_ir.layouts.cluster import load_cluster
from slide_ir.layouts.models import load_layout_model
from slide_ir.layouts.plan import Layout, balanced_split
from slide_ir.layouts.pools import colocated, search_pools, training_layout
from slide_ir.layouts.rollout import Engine, RolloutWork, build_engine_ledger

NODE = load_cluster("h200-8gpu-node")
WORK = RolloutWork(prompts=8, samples=8, prompt_len=2048, response_len=131072)
KNOBS = {"cpu_adam": True, "recompute": True, "distributed_optimizer": True}
RECIPES = [  # (label, model, training layout, engine)
    ("30B-A3B", "qwen3-30b-a3b", Layout(gpus=8, tp=2, cp=4, ep=8, **KNOBS),
     Engine(gpus=8, tp=2, ep=8)),
    ("355B-A32B", "glm-4.5", Layout(gpus=64, tp=8, pp=4, cp=2, ep=16, **KNOBS),
     Engine(gpus=32, tp=8, ep=32)),
    ("744B-A40B", "glm-5", Layout(gpus=256, tp=4, pp=8, cp=8, ep=32,
                                  pp_layers=balanced_split(78, 8), **KNOBS),
     Engine(gpus=64, tp=8, ep=64)),
    ("27B dense (Qwen3-32B)", "qwen3-32b", Layout(gpus=32, tp=4, pp=2, cp=4, **KNOBS),
     Engine(gpus=2, tp=2)),
]  # fmt: skip
plans = {}
for label, model, base, engine in RECIPES:
    spec = load_layout_model(model)
    plan = colocated(spec, training_layout(base, WORK, base.gpus), engine, WORK, NODE)
    plans[label] = plan
    phases = ", ".join(f"{k} {b / 2**30:.0f}" for k, b in plan.phases)
    print(
        f"{label} on {base.gpus} GPUs: {plan.layout.describe()}; "
        f"{plan.rollout_gpus // engine.gpus} x {engine.describe()}"
    )
    print(
        f"  GPU GiB per phase: {phases} (of {NODE.gpu_memory_bytes / 2**30:.0f}); host "
        f"{plan.host_per_node / 2**30:.0f} GiB per node; fits: {plan.fits}"
    )
    print(
        f"  step {plan.step_s:.0f} s = rollout {plan.times.round_s:.0f} + train "
        f"{plan.train_s:.0f} + switch {plan.switch_s:.1f} + sync {plan.sync_s:.1f}; "
        f"{plan.times.decode_tokens_per_s_per_gpu:.0f} decode tokens/s/GPU"
    )

# %% [markdown]
# What one engine GPU holds in each recipe: at 130K tokens per sequence the KV cache, not the
# weights, is what the engine is sized for.

# %%
fig, ax = plt.subplots(figsize=(8, 3))
names = [name for name, _ in next(iter(plans.values())).rollout.gpu_terms]
left = [0.0] * len(plans)
for term in names:
    sizes = [p.rollout.term(term) / 2**30 for p in plans.values()]
    ax.barh(list(plans), sizes, left=left, label=term)
    left = [a + b for a, b in zip(left, sizes, strict=True)]
ax.axvline(NODE.gpu_memory_bytes / 2**30, color="k", ls="--", lw=1)
ax.set_xlabel("GiB per engine GPU (dashed: capacity)")
ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# How many of the round's 64 sequences one 30B-A3B engine can hold as responses grow, with BF16
# and FP8 KV: beyond that the round runs in waves.

# %%
spec = load_layout_model("qwen3-30b-a3b")
lengths = [8192, 16384, 32768, 65536, 131072, 262144]
fig, ax = plt.subplots(figsize=(6, 3))
for kv in ("bf16", "fp8"):
    engine = Engine(gpus=8, tp=2, ep=8, kv_dtype=kv)
    batches = [build_engine_ledger(spec, engine, RolloutWork(response_len=n), NODE, 1).max_batch
               for n in lengths]  # fmt: skip
    ax.plot(lengths, batches, "o-", label=f"KV {kv}")
ax.axhline(64, color="k", ls="--", lw=1)
ax.set_xscale("log", base=2)
ax.set_xlabel("response tokens")
ax.set_ylabel("sequences the KV holds")
ax.legend()
fig.tight_layout()

# %% [markdown]
# Co-located or split? For the 30B-A3B recipe's 8 GPUs, the fastest plans of each kind
# (`slide rollout --search`): a split pool leaves half the GPUs idle while the other half works,
# unless rollouts and training overlap one step off-policy (`overlapped_s`).

# %%
base = Layout(gpus=8, **KNOBS)
ranked = search_pools(spec, base, WORK, NODE, 8, top=1000)
for mode in ("colocated", "split"):
    plan = next(p for p in ranked if p.mode == mode)
    print(
        f"{mode:9s} train on {plan.layout.gpus} GPUs {plan.layout.describe()}, "
        f"{plan.rollout_gpus // plan.engine.gpus} x {plan.engine.describe()}: step "
        f"{plan.step_s:.0f} s (overlapped {plan.overlapped_s:.0f} s), peak "
        f"{plan.peak_bytes / 2**30:.0f} GiB"
    )
