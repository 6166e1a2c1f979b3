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
# # Will it fit?
# For a few catalog models and machines: does full fine-tuning fit (sliding schedule, activations
# and optimizer state in CPU RAM), at which batch, how fast, and with what hiding factor eta.
# The batch tried is the largest power of two up to 64 whose plan fits every memory tier.

# %%
import matplotlib.pyplot as plt
import numpy as np

from slide.api import load_machine, load_model, plan, simulate

MODELS = ["llama-3.2-3b", "llama-3.1-8b", "qwen2.5-14b", "qwen2.5-32b", "llama-3.1-70b"]
MACHINES = ["paper-pc-4090", "paper-server-a100", "h200-16c-128g"]


def largest_batch(model, machine):
    fitting = [
        b
        for b in (1, 2, 4, 8, 16, 32, 64)
        if plan(model, machine, batch=b, seq=1024, steps=1).feasible
    ]
    return max(fitting) if fitting else None


rows = []
for machine in MACHINES:
    for model in MODELS:
        b = largest_batch(load_model(model), load_machine(machine))
        s = simulate(model, machine, batch=b, seq=1024).summary() if b else {}
        rows.append((machine, model, b, s.get("tokens_per_s"), s.get("eta"), s.get("bottleneck")))
for r in rows:
    print(
        f"{r[0]:18s} {r[1]:14s} "
        + (
            f"batch {r[2]:3d}  {r[3]:8,.0f} tokens/s  eta {r[4]:.2f}  bound by {r[5]}"
            if r[2]
            else "does not fit"
        )
    )

# %%
tps = np.array([[r[3] or 0.0 for r in rows if r[0] == m] for m in MACHINES])
fig, ax = plt.subplots(figsize=(9, 3.2))
im = ax.imshow(tps, cmap="viridis")
ax.set_xticks(range(len(MODELS)), MODELS, rotation=20)
ax.set_yticks(range(len(MACHINES)), MACHINES)
for (i, j), v in np.ndenumerate(tps):
    b = [r[2] for r in rows if r[0] == MACHINES[i]][j]
    ax.text(
        j,
        i,
        f"{v:,.0f}\nbatch {b}" if v else "does not fit",
        ha="center",
        va="center",
        color="white" if v < tps.max() / 2 else "black",
        fontsize=8,
    )
fig.colorbar(im, ax=ax, label="predicted tokens/s (seq 1024)")
ax.set_title(
    "Full fine-tuning, sliding schedule: predicted throughput at the largest fitting batch"
)
plt.tight_layout()
plt.show()
