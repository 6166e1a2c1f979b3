"""The reference loop: its unit groups match the executor's units, and its BF16-model path
(FP32 master weights beside a BF16 model) tracks the FP32 one."""

import pytest
import torch
from hf_models import hf_model, spec_of
from runs import batches, model_config

from executor.layout import unit_layouts
from executor.reference_loop import reference_train, units


@pytest.mark.parametrize("tied", [True, False])
def test_units_are_the_executors(tied):
    model = hf_model(model_config(tied))
    groups = units(model, dict(model.named_parameters()))
    layouts = unit_layouts(spec_of(model_config(tied)))
    assert len(groups) == len(layouts)
    for group, layout in zip(groups, layouts.values(), strict=True):
        assert sum(t.numel() for t in group) == layout.numel


def test_bf16_model_with_fp32_master_tracks_fp32():
    data = batches(3)
    fp32_losses, fp32 = reference_train(hf_model(model_config(False)), data, lr=1e-3)
    bf16_losses, bf16 = reference_train(
        hf_model(model_config(False)), data, lr=1e-3, dtype=torch.bfloat16
    )
    assert all(t.dtype == torch.float32 for t in bf16.values())
    assert max(abs(a - b) for a, b in zip(fp32_losses, bf16_losses, strict=True)) < 0.05
    moved = sum(float((bf16[k] - fp32[k]).norm()) for k in fp32)
    assert moved > 0  # BF16 rounding shows, but the run is the same training
