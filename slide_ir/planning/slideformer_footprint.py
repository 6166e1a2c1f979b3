"""SlideFormer's host RAM for a run, counted as its published code allocates it: what `slide
capacity` and `bench/memory/host_bytes.py` set the ledger beside, mode for mode.

From SlideFormer's code (the anchors' `ext/SlideFormer`: `SlideFormerOffloader.__init__` and
`_print_memory_occupancy` in offload_transformer.py, `LayerAdam` in layer_adam.py):
- the FP32 master of every parameter stays in RAM, 4 B/param, in every mode: its NVMe tier
  (`nvme_offload_fraction`, 0, 0.5 or 1) takes Adam moments only;
- both moments, 4 B each (2 with `fp32_optimizer_state=False`), less the share on NVMe;
- one pinned gradient buffer (two with `double_buffer`, off by default and in our bench) and one
  pinned convert buffer, each the largest unit in BF16 (`parameter_sizes`: the embedding, a
  decoder layer, or the final norm with the output matrix, the tied one too);
- a tied model's pinned BF16 gradient accumulator for the embedding;
- one pinned BF16 (batch, seq, hidden) input per decoder layer, unless `ac_offload_nvme`;
- with moments on NVMe, those its prefetch holds in RAM, which its own estimate leaves out:
  tensornvme frees a tensor once written and restores it to read it, and `LayerAdam` reads a
  unit's moments one unit ahead (`_pre_step`) and writes them back after its update
  (`_post_step`), so at the step's last update the embedding's moments are being updated, the
  head's read ahead for the next step and the first layer's write-back is in flight.
Its printed estimate ("Total CPU Estimated Memory") is the sum without that last term and
without the process itself; the ledger's process-runtime term (`compute_terms.host_terms`) is
added here so both sides count the same Python and torch. Measured on the H200 at llama-3.2-3b
batch 16: its peak RSS 43.87 GiB against 40.73 counted here less the runtime (bench/RESULTS.md).
"""

from __future__ import annotations

from typing import Any

from slide_ir.planning.compute_terms import HOST_RUNTIME_BYTES
from slide_ir.planning.units import BF16, FP32, unit_params
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model, model_names


def slideformer_host_bytes(model: ModelSpec, config: TrainConfig) -> dict[str, int]:
    """SlideFormer's host bytes per term for `config`'s optimizer placement ("cpu": nothing on
    NVMe; "nvme-moments" and "nvme", which it cannot place: its moments all on NVMe),
    moment precision and activation placement ("nvme": `ac_offload_nvme`)."""
    n, p, moment = model.num_layers, model.total_params, config.moment_bytes
    largest = max(model.embedding_params, model.layer_params,
                  model.final_norm_params + model.vocab_size * model.hidden_size)  # fmt: skip
    on_nvme = config.optimizer != "cpu"
    terms = {
        "fp32 master": p * FP32,
        "adam moments": 0 if on_nvme else p * moment,
        "gradient buffer": largest * BF16,
        "convert buffer": largest * BF16,
        "tied gradient accumulator": model.embedding_params * BF16 if model.tied_embeddings else 0,
        "layer inputs": 0 if config.activations == "nvme" else _layer_inputs(model, config),
        "moments in flight": sum(unit_params(model, u) for u in (0, n + 1, 1)) * moment
        if on_nvme else 0,
        "process runtime": HOST_RUNTIME_BYTES,
    }  # fmt: skip
    return {label: b for label, b in terms.items() if b}


def slideformer_nvme_bytes(model: ModelSpec, config: TrainConfig) -> int:
    """What SlideFormer puts on NVMe: every moment with the optimizer off the host, the layer
    inputs with them on a drive."""
    moments = model.total_params * config.moment_bytes if config.optimizer != "cpu" else 0
    return moments + (_layer_inputs(model, config) if config.activations == "nvme" else 0)


def _layer_inputs(model: ModelSpec, config: TrainConfig) -> int:
    """One BF16 (batch, seq, hidden) input per decoder layer."""
    return model.num_layers * config.batch * config.seq * model.hidden_size * BF16


def slideformer_capacity(
    machine: Machine, config: TrainConfig, model_name: str | None
) -> dict[str, Any]:
    """SlideFormer beside a `capacity` answer: its host bytes per parameter for `model_name`
    (the largest model the ledger fits) and the largest catalog model its own count fits in
    the same usable RAM (`TrainConfig.host_margin`) and drives."""
    ram = machine.ram_bytes * (1.0 - config.host_margin)
    drives = sum(d.capacity_bytes for d in machine.nvme)

    def fits(m: ModelSpec) -> bool:
        nvme = slideformer_nvme_bytes(m, config)
        return sum(slideformer_host_bytes(m, config).values()) <= ram and nvme <= drives

    specs = [load_model(n) for n in model_names()]
    best = max((m for m in specs if fits(m)), key=lambda m: m.total_params, default=None)
    ours = load_model(model_name) if model_name else None
    per_param = (sum(slideformer_host_bytes(ours, config).values()) / ours.total_params
                 if ours else None)  # fmt: skip
    return {
        "slideformer_host_bytes_per_param": round(per_param, 3) if per_param else None,
        "slideformer_largest_model": best.name if best else None,
        "slideformer_largest_model_params": best.total_params if best else 0,
    }
