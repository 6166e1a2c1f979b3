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
# # Scaling
# How the sliding schedule behaves as model, batch, memory and schedule change, all predicted by
# the simulator from the same plans the executor runs.
# 1. Critical batch (smallest batch with eta >= 1) against model size, per GPU.
# 2. Throughput against batch, against the compute-only peak.
# 3. Largest trainable catalog model against host RAM, with and without NVMe.
# 4. Sliding against the ZeRO-Offload-style synchronous schedule.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

from slide.api import (
    TrainConfig,
    batch_sweep,
    critical_batch,
    load_machine,
    load_model,
    plan,
    schedule_sweep,
)

SIZES = ["qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"]
MACHINES = ["paper-pc-4090", "paper-server-a100", "h200-16c-128g"]
# pure sliding (placement="small"), the paper's schedule: the default placement may keep a whole
# model resident, where eta is infinite at any batch and the critical batch reads 1
probe = TrainConfig(batch=1, seq=1024, steps=2, placement="small")
fig, ax = plt.subplots(figsize=(7, 3.5))
for machine in MACHINES:
    m = load_machine(machine)
    crit = [
        critical_batch(s, m, probe, max_batch=128, ignore_memory=True).critical_batch for s in SIZES
    ]
    params = [load_model(s).total_params / 1e9 for s in SIZES]
    assert max(crit) < 2 * min(crit), (machine, crit)  # what the title says
    ax.plot(params, crit, marker="o", label=machine)
ax.set_xscale("log")
ax.set_xticks(params, [s.split("-")[1] for s in SIZES])
ax.minorticks_off()
ax.set_xlabel("model size (qwen2.5 family, log scale)")
ax.set_ylabel("critical batch (eta >= 1)")
ax.set_title("Critical batch barely moves with model size (pure sliding)")
ax.legend()
plt.tight_layout()
plt.show()

# %%
rows = batch_sweep(
    "llama-3.1-8b",
    "paper-pc-4090",
    TrainConfig(batch=1, seq=1024),
    [1, 2, 4, 8, 16, 24, 32, 48, 64],
)
ok = [r for r in rows if r.get("feasible")]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(
    [r["batch"] for r in ok],
    [r["tokens_per_s"] for r in ok],
    marker="o",
    label="sliding (predicted)",
)
ax.plot(
    [r["batch"] for r in ok],
    [r["compute_only_tokens_per_s"] for r in ok],
    ls="--",
    label="compute-only peak",
)
ax.set_xlabel("batch (x 1024 tokens)")
ax.set_ylabel("tokens/s")
ax.set_title("llama-3.1-8b on paper-pc-4090")
ax.legend()
plt.tight_layout()
plt.show()

# %%
from slide_ir.specs.model_catalog import model_names

catalog = sorted((load_model(n) for n in model_names()), key=lambda s: s.total_params)
rams = [64, 128, 256, 512, 1024]


def largest(ram_gb, optimizer, activations, nvme):
    machine = load_machine("paper-pc-4090", ram_gb=ram_gb, nvme=nvme)
    fits = [
        s
        for s in catalog
        if plan(
            s, machine, batch=1, seq=1024, steps=1, optimizer=optimizer, activations=activations
        ).feasible
    ]
    return fits[-1].total_params / 1e9 if fits else 0.0


fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(
    rams,
    [largest(r, "cpu", "cpu", 1) for r in rams],
    marker="o",
    label="optimizer + activations in RAM",
)
ax.plot(
    rams, [largest(r, "nvme", "nvme", 2) for r in rams], marker="s", label="both on 2 NVMe drives"
)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("host RAM (GiB), RTX 4090 PC")
ax.set_ylabel("largest catalog model (B params)")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# On the H200 the host AdamW bounds pure sliding until batch ~48. Streamed updates (the default)
# move the updates that end the backward to the GPU, their FP32 state streamed over PCIe and
# spread over the backward, so the copy engines share the optimizer's work; the layer inputs then
# stay on the GPU and leave the link to the state. Lines: predicted with the calibration of the
# machine lease the markers were measured on (bench/data/h200-session3, see bench/RESULTS.md).

# %%
BATCHES = [4, 8, 16, 32, 48, 64]
MEASURED = Path("../bench/data/h200-session3")
LEASE = str(MEASURED / "calibrated.toml")
fig, ax = plt.subplots(figsize=(7, 3.5))
for label, placement in (
    ("pure sliding (placement small)", "small"),
    ("the default (fast)", "fast"),
):
    rows = batch_sweep(
        "llama-3.2-3b", LEASE, TrainConfig(batch=1, seq=1024, placement=placement), BATCHES
    )
    ok = [r for r in rows if r.get("feasible")]
    ax.plot([r["batch"] for r in ok], [r["tokens_per_s"] for r in ok], marker=".", label=label)
ax.plot(
    [r["batch"] for r in ok],
    [r["compute_only_tokens_per_s"] for r in ok],
    ls="--",
    color="grey",
    label="compute-only peak (predicted)",
)
points = [json.loads(line) for line in (MEASURED / "throughput.jsonl").read_text().splitlines()]
for variant, marker in (("pure", "s"), ("streamed=auto+activations=gpu", "^")):
    got = [p for p in points if p.get("variant") == variant and p.get("model") == "llama-3.2-3b"]
    ax.scatter([p["batch"] for p in got], [p["tokens_per_s"] for p in got], marker=marker,
               color="black", zorder=3, label=f"measured: {variant}")  # fmt: skip
ceiling = [p for p in points if p.get("system") == "compute-only" and p["model"] == "llama-3.2-3b"]
ax.scatter([p["batch"] for p in ceiling], [p["tokens_per_s"] for p in ceiling], marker="x",
           color="grey", zorder=3, label="measured: compute-only")  # fmt: skip
ax.set_xlabel("batch (x 1024 tokens)")
ax.set_ylabel("tokens/s")
ax.set_title("llama-3.2-3b on the H200 machine")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %%
for row in schedule_sweep("llama-3.1-8b", "h200-16c-128g", TrainConfig(batch=16, seq=1024)):
    fit = "" if row.get("feasible") else "  (does not fit)"
    tps = row.get("tokens_per_s")
    print(f"{row['schedule']:13s} " + (f"{tps:8,.0f} tokens/s" if tps else "   -") + fit)
