"""Global-norm clipping (`--clip global`): the norm as torch's clip_grad_norm_ takes it, the
deferred updates against the plain PyTorch loop on every placement the CPU mode runs, and a
step with a non-finite gradient skipped with the state untouched."""

from __future__ import annotations

import pytest
import torch
from hf_models import CONFIGS, hf_model, spec_of, tiny_config
from runs import (
    STEPS,
    assert_bitwise_equal,
    assert_matches_reference,
    batches,
    graph_of,
    max_rel_error,
    reference,
    run_executor,
)

from executor import repetition
from executor.clipping import clip_scale, hf_order, param_norms
from executor.env import MicroBatch
from executor.layout import unit_layouts
from executor.repetition import NonFiniteLossError
from slide_ir.ir.graph import OpKind, PoolRole

CLIP = {"clip": "global", "clip_norm": 0.05}  # small enough that every step clips

CASES = {
    "sliding": (False, 0, {}),
    "tied-resident-mix": (True, 0, {"resident": 2}),
    "accum-sliding": (False, 0, {"grad_accum": 2}),
    "tied-accum-resident-mix": (True, 0, {"resident": 3, "grad_accum": 2}),
    "nvme-state": (False, 1, {"optimizer": "nvme"}),
    # streamed units update after the norm through two GPU state slots: three layers take turns
    "streamed-after-the-norm": (False, 0, {"streamed": 4, "speculate": 0}),
    "tied-resident-streamed-mix": (True, 0, {"resident": 1, "streamed": 3}),
    "all-resident-kept-tapes": (True, 0, {"placement": "fast", "activations": "gpu"}),
    "gpu-only": (True, 0, {"schedule": "gpu-only"}),
    "gpu-only-accum": (False, 0, {"schedule": "gpu-only", "grad_accum": 2}),
    "zero-offload": (True, 0, {"schedule": "zero-offload"}),
    "zero-offload-accum": (False, 0, {"schedule": "zero-offload", "grad_accum": 2}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_clip_grad_norm_loop(case: str) -> None:
    tied, drives, extra = CASES[case]
    config = {**CLIP, **extra}
    result = run_executor(tied, drives=drives, **config)
    assert_matches_reference(result, tied, config)


def test_differs_from_per_unit_clipping() -> None:
    """The case above would pass for per-unit clipping too if the modes were the same."""
    result = run_executor(False, **CLIP)
    _, per_unit = reference(False, 1, CLIP["clip_norm"], clip_global=False)
    err, _ = max_rel_error(result.final_state, per_unit)
    assert err > 100 * 1e-5


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_hf_order_is_the_models_parameter_order(arch: str) -> None:
    config = tiny_config(arch)
    model = hf_model(config)
    layouts = unit_layouts(spec_of(config))
    ours = [e.name for u in sorted(layouts) for e in hf_order(layouts[u])]
    assert ours == [name for name, _ in model.named_parameters()]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_scale_is_clip_grad_norm_s_bitwise(arch: str) -> None:
    """The units' flat gradients (our layout), their norms and the scale against
    clip_grad_norm_ on the model's own gradients: equal bit for bit, and so are the scaled
    gradients."""
    config = tiny_config(arch)
    model = hf_model(config).float()
    ids = torch.randint(0, config["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    layouts = unit_layouts(spec_of(config))
    per_unit = []
    for u in sorted(layouts):
        flat = torch.zeros(layouts[u].numel)
        for e in layouts[u].hf:
            e.view(flat).copy_(grads[e.name])
        per_unit.append(param_norms(flat, layouts[u], 0, layouts[u].numel))
    scale, total = clip_scale(torch.cat(per_unit), 0.05)
    want = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    assert torch.equal(total, want)
    assert float(scale) < 1.0
    for name, p in model.named_parameters():
        assert torch.equal(grads[name] * scale, p.grad), name


def test_shard_norms_cover_the_unit() -> None:
    """A rank's parts of each parameter: their squared norms sum to the whole parameter's."""
    config = CONFIGS["llama"]
    layout = unit_layouts(spec_of(config))[1]
    grad = torch.randn(layout.numel, generator=torch.Generator().manual_seed(2))
    cut = layout.numel // 3
    parts = [param_norms(grad[a:b], layout, a, b) for a, b in ((0, cut), (cut, layout.numel))]
    whole = param_norms(grad, layout, 0, layout.numel)
    torch.testing.assert_close(parts[0].square() + parts[1].square(), whole.square())


def _poison(monkeypatch: pytest.MonkeyPatch, steps: set[int]) -> None:
    """The micro-batches of global `steps` scaled by NaN: their gradients are all NaN."""
    real = repetition.micro_batches

    def poisoned(it, step, info, base, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(it, step, info, base, *args, **kwargs)
        if base + step in steps:
            out = [MicroBatch(step=m.step, micro=m.micro, scale=float("nan")) for m in out]
        return out

    monkeypatch.setattr(repetition, "micro_batches", poisoned)


@pytest.mark.parametrize(
    "extra",
    [{}, {"resident": 2}, {"streamed": 3, "speculate": 0}],
    ids=["sliding", "resident-mix", "streamed"],
)
def test_non_finite_step_skipped_bitwise(monkeypatch: pytest.MonkeyPatch, extra: dict) -> None:
    """Step 3's gradients NaN: the run equals one that never saw step 3's batch, bit for bit
    (Adam's bias correction counts the updates made)."""
    steps = 6
    clean = run_executor(False, steps=steps - 1, **CLIP, **extra,
                         train_kwargs={"batches": _without(batches(steps), 2)})  # fmt: skip
    _poison(monkeypatch, {3})
    poisoned = run_executor(False, steps=steps, **CLIP, **extra)
    assert poisoned.losses[2] != poisoned.losses[2]  # NaN
    del poisoned.losses[2]
    assert_bitwise_equal(poisoned, clean)


def test_stops_after_max_skipped_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    _poison(monkeypatch, set(range(2, STEPS + 1)))
    with pytest.raises(NonFiniteLossError, match="2 steps in a row had non-finite gradients"):
        run_executor(False, steps=STEPS, **CLIP, train_kwargs={"max_skipped_steps": 2})


def _without(items: list, index: int) -> list:
    return items[:index] + items[index + 1 :]


# -- speculative updates --------------------------------------------------------------------
SPECULATION = {
    "sliding": (False, {}),
    "accum-sliding": (False, {"grad_accum": 2}),
    "tied-resident-mix": (True, {"resident": 2}),
    "streamed-mix": (False, {"streamed": 3}),
}


@pytest.mark.parametrize("clip_norm", [0.05, 1e6], ids=["every-step-clips", "none-clips"])
@pytest.mark.parametrize("case", sorted(SPECULATION))
def test_speculation_equals_deferral_bitwise(case: str, clip_norm: float) -> None:
    """Every host update speculating (then redone from the saved state where the step clips, or
    kept where it does not) gives the deferred updates' result bit for bit; the graph does
    speculate (its updates save state and are redone)."""
    tied, extra = SPECULATION[case]
    config = {"clip": "global", "clip_norm": clip_norm, **extra}
    graph = graph_of(tied, speculate=99, **config)
    assert any(op.kind == OpKind.REDO for op in graph.ops)
    assert any(p.role == PoolRole.ROLLBACK for p in graph.pools)
    speculated = run_executor(tied, speculate=99, **config)
    deferred = run_executor(tied, speculate=0, **config)
    assert_bitwise_equal(speculated, deferred)
    if clip_norm < 1:
        assert_matches_reference(speculated, tied, config)


def test_speculative_non_finite_step_skipped_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 3's gradients NaN with every update speculating: its updates are rolled back, and
    the run equals one that never saw step 3's batch, bit for bit."""
    steps = 6
    clean = run_executor(False, steps=steps - 1, **CLIP, speculate=99,
                         train_kwargs={"batches": _without(batches(steps), 2)})  # fmt: skip
    _poison(monkeypatch, {3})
    poisoned = run_executor(False, steps=steps, **CLIP, speculate=99)
    del poisoned.losses[2]
    assert_bitwise_equal(poisoned, clean)
