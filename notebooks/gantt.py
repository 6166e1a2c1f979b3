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
# # One step, predicted and measured
# The simulator's timeline of a plan, next to the executor's measured timeline of the same plan
# on the H200 machine (a trace recorded there and committed under `notebooks/data/`). Rows are
# lanes (GPU compute, host-to-device, device-to-host, CPU optimizer); below, memory per tier.
# The committed run streams the updates of the embedding and layers 1-17 through the GPU (their
# FP32 state goes up and down the link, spread over the backward) while the CPU updates the
# rest; the layer inputs stay on the GPU, so the last states go down during the next forward.

# %%
import json
import tempfile
from pathlib import Path

from IPython.display import Image, display

from slide.api import simulate
from slide.gantt import plot_gantt, plot_gantt_pair
from slide_ir.ir.trace import Trace, trace_metrics

OUT = Path(tempfile.mkdtemp())  # pictures go to a scratch directory, not the repository
measured_file = next(iter(sorted(Path("data").glob("measured_*.trace.json"))), None)
print("measured trace:", measured_file)

# %%
if measured_file is not None:
    measured = Trace.from_json(measured_file.read_text())
    info = measured.info
    meta = json.loads(
        measured_file.with_name(measured_file.name.replace(".trace.json", ".meta.json")).read_text()
    )
    print(meta["source"])
    predicted_result = simulate(
        info.model,
        meta["machine"],
        batch=info.batch,
        seq=info.seq,
        steps=info.steps,
        **meta.get("config", {}),
    )
else:  # no committed trace: show the prediction alone
    predicted_result = simulate("llama-3.2-3b", "h200-16c-128g", batch=16, seq=1024, steps=3)
predicted = predicted_result.trace
display(Image(filename=str(plot_gantt(predicted, OUT / "predicted.png", title="predicted"))))

# %%
if measured_file is not None:
    display(
        Image(
            filename=str(plot_gantt(measured, OUT / "measured.png", title="measured on the H200"))
        )
    )
    p, m = trace_metrics(predicted), trace_metrics(measured)
    for name in ("step_time_s", "tokens_per_s", "eta", "t_bwd_s", "t_d2h_s", "t_update_s"):
        a, b = getattr(p, name), getattr(m, name)
        print(f"{name:14s} predicted {a:10.4g}  measured {b:10.4g}  error {(a - b) / b:+.1%}")

# %% [markdown]
# The two steady steps aligned at their start, lane above lane: where the prediction runs ahead.

# %%
if measured_file is not None:
    display(Image(filename=str(plot_gantt_pair(predicted, measured, OUT / "pair.png"))))
