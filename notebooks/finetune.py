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
# # A real fine-tune from a plan
# The built-in `tiny-llama` (4 layers, 512-token vocabulary) fine-tuned on the bundled corpus by
# the executor, from the planner's sliding schedule: loss curve and the measured timeline. On a
# CPU-only machine the executor runs the same Graph with synchronous stand-ins for the CUDA
# streams; the last cell (a 1B-class model) needs a GPU and skips itself without one.

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import Image, display

from slide.train_request import TrainRequest
from slide.training import run_training
from slide_ir.specs.config import TrainConfig

OUT = Path(tempfile.mkdtemp())
request = TrainRequest(
    model="tiny-llama",
    machine="auto",
    config=TrainConfig(batch=8, seq=128, steps=30),
    lr=3e-3,
    progress=False,
    out=str(OUT / "checkpoint"),
    metrics=str(OUT / "metrics.jsonl"),
    gantt=str(OUT / "gantt.png"),
)
summary = run_training(request)
print(
    f"{summary['steps_done']} steps on {summary['machine']}: loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}"
)
rows = [json.loads(line) for line in Path(request.metrics).read_text().splitlines()]

# %%
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker=".")
ax.set_xlabel("optimizer step")
ax.set_ylabel("mean token loss (nats)")
ax.set_title("tiny-llama on the bundled corpus")
plt.tight_layout()
plt.show()
display(Image(filename=request.gantt))

# %%
from transformers import AutoModelForCausalLM

reloaded = AutoModelForCausalLM.from_pretrained(request.out)  # the checkpoint is plain HF format
print(type(reloaded).__name__, sum(p.numel() for p in reloaded.parameters()), "parameters")

# %% [markdown]
# On a CUDA machine: a 1B-class model (random init, llama-3.2-1b shapes) for a few steps.

# %%
if torch.cuda.is_available():
    gpu = TrainRequest(
        model="llama-3.2-1b",
        machine="auto",
        config=TrainConfig(batch=8, seq=1024, steps=5),
        lr=1e-5,
        progress=False,
        gantt=str(OUT / "gpu.png"),
    )
    result = run_training(gpu)
    print(f"{result['tokens_per_s']:,.0f} tokens/s, eta {result['eta']:.2f}")
    display(Image(filename=gpu.gantt))
else:
    print("skipped: no CUDA device here")
