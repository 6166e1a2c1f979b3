"""Shared by the executor's training tests: a tiny model, its data, the plain PyTorch loop the
executor must reproduce, and the executor run itself (CPU mode, FP32)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from hf_models import hf_model, spec_of, state_dict_fp32, tiny_config

from executor import setup
from executor.adam import AdamWConfig
from executor.ranks import Ranks
from executor.reference_loop import reference_train
from executor.run import TrainResult
from slide.session import train
from slide_ir import TrainConfig, load_machine
from slide_ir.ir.graph import Graph
from slide_ir.planning.planner import Plan, plan
from slide_ir.planning.programs import program

B, S, STEPS, LR = 2, 16, 10, 1e-3
MACHINE = "h200-16c-128g"


def model_config(tied: bool) -> dict:
    """4 layers, hidden 64, vocab 512. No attention biases: a k_proj bias has an (almost) zero
    gradient by softmax shift-invariance, so Adam turns float noise into full-size steps and no
    two implementations agree on it."""
    return tiny_config(
        "llama",
        num_hidden_layers=4,
        tie_word_embeddings=tied,
        attention_bias=False,
        mlp_bias=False,
        rope_scaling=None,
    )


def batches(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n micro-batches; a few labels are -100 (ignored), as prompt masking makes them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, 512, (B, S), generator=g)
        labels = torch.randint(0, 512, (B, S), generator=g)
        labels[i % B, : i % 5] = -100
        out.append((ids, labels))
    return out


@functools.cache
def reference(
    tied: bool, grad_accum: int, clip_norm: float | None = None, clip_global: bool = False
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`executor.reference_loop` on this model and data, FP32, torch AdamW (no weight decay)."""
    model = hf_model(model_config(tied))
    return reference_train(
        model, batches(STEPS * grad_accum), lr=LR, grad_accum=grad_accum, clip_norm=clip_norm,
        clip_global=clip_global,
    )  # fmt: skip


def run_executor(
    tied: bool,
    drives: int = 0,
    steps: int = STEPS,
    first_batch: int = 0,
    train_kwargs: dict | None = None,
    **config: object,
) -> TrainResult:
    """The executor in CPU mode on the same model, data and optimizer (`drives`: NVMe drives,
    files in a temporary directory; `first_batch`: skip that many micro-batches of the data).
    Placements are `small` (pure sliding) unless the case pins otherwise: a case names the
    placement it tests, and the fastest-placement search would move the tiny model whole onto
    the "GPU"."""
    config = {"placement": "small", **config}
    cfg = model_config(tied)
    grad_accum = int(config.get("grad_accum", 1))  # type: ignore[call-overload]
    kwargs = {
        "initial_state": state_dict_fp32(hf_model(cfg)),
        "optim": AdamWConfig(lr=LR),
        "batches": batches(first_batch + steps * grad_accum)[first_batch:],
        **(train_kwargs or {}),
    }
    return train(
        spec_of(cfg),
        load_machine(MACHINE, nvme=drives),
        TrainConfig(batch=B, seq=S, steps=steps, **config),  # type: ignore[arg-type]
        device="cpu",
        dtype=torch.float32,
        **kwargs,
    )


def graph_of(tied: bool, drives: int = 0, steps: int = STEPS, **config: object) -> Graph:
    """The graph `run_executor` runs with these arguments (one repetition: steps <= 64)."""
    config = {"placement": "small", **config}
    train_config = TrainConfig(batch=B, seq=S, steps=steps, **config)  # type: ignore[arg-type]
    return plan(spec_of(model_config(tied)), load_machine(MACHINE, nvme=drives), train_config).graph


def build_run(
    p: Plan, cfg: dict, nvme_dir: Path, dtype: torch.dtype, ranks: Ranks | None = None
) -> setup.Built:
    """The executor's set-up of plan `p` on the CPU (buffers, environment, state loaded from
    `cfg`'s random model), without running it: for tests of what set-up allocates. `ranks`:
    rank `ranks.rank`'s of a data-parallel run (no collective is made)."""
    nproc, rank = (ranks.nproc, ranks.rank) if ranks is not None else (1, 0)
    return setup.build(
        program(p, [p.config.steps], cpu_threads=None, nproc=nproc, rank=rank),
        device=torch.device("cpu"),
        dtype=dtype,
        optim=AdamWConfig(),
        step_offset=0,
        total_steps=1,
        nvme_dir=nvme_dir,
        initial_state=state_dict_fp32(hf_model(cfg)),
        initial_optim_state=None,
        ranks=ranks,
    )


def assert_bitwise_equal(a: TrainResult, b: TrainResult) -> None:
    assert a.losses == b.losses
    assert set(a.final_state) == set(b.final_state)
    for name, t in a.final_state.items():
        assert torch.equal(t, b.final_state[name]), name


# per-step losses and per-tensor weight errors (norm-relative) against the reference loop:
# observed ~1e-6, from the fused q/k/v and gate/up matmuls
RTOL = 1e-5


def assert_matches_reference(result: TrainResult, tied: bool, config: dict) -> None:
    """`result` (a run of STEPS steps under `config`) against `reference` with the same
    micro-batching and clipping, within RTOL."""
    grad_accum = int(config.get("grad_accum", 1))
    clipped = config.get("clip") in ("per-unit", "global")
    clip = float(config["clip_norm"]) if clipped else None
    ref_losses, ref_state = reference(tied, grad_accum, clip, config.get("clip") == "global")
    assert result.steps_done == STEPS
    for step, (ours, want) in enumerate(zip(result.losses, ref_losses, strict=True), 1):
        assert abs(ours - want) <= RTOL * abs(want), f"step {step}: loss {ours} vs {want}"
    err, name = max_rel_error(result.final_state, ref_state)
    assert err <= RTOL, f"{name}: relative error {err:.2e}"


def max_rel_error(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest per-tensor relative error ||ours - ref|| / ||ref||, and its tensor's name."""
    assert set(ours) == set(ref), set(ours) ^ set(ref)
    errs = {k: float((ours[k] - v).norm() / v.norm()) for k, v in ref.items()}
    name = max(errs, key=errs.__getitem__)
    return errs[name], name
