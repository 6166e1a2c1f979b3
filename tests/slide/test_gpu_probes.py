"""`slide calibrate`: the dispatch floors time real calls on the CPU; the whole run needs CUDA."""

import pytest
import torch

from slide.calibration import gpu_probes as cal
from slide.cli import main
from slide_ir.specs.hardware import load_machine


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only machine")
def test_calibrate_refuses_without_cuda(tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "m.toml")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_calibrated_profile_loads(tmp_path):
    out = tmp_path / "m.toml"
    assert main(["calibrate", "--nvme-dir", str(tmp_path / "disk"), "--out", str(out)]) == 0
    machine = load_machine(str(out))
    assert machine.gpu.bf16_matmul_tflops > 10 and machine.link.h2d_bytes_per_s > 1e9
    assert all(
        src.startswith("measured") or "datasheet" in src or src.startswith("http")
        for src in dict(machine.sources).values()
    )


def test_dispatch_floors_time_the_layer_calls_the_executor_makes():
    """On the CPU the same calls run (fused kernels' torch fallbacks): each floor is a real,
    positive time, named for the op it stands in for."""
    from slide_ir.specs.model_catalog import load_model

    floors = cal.dispatch_floors(load_model("tiny-llama"), device="cpu", repeats=3)
    assert set(floors) == {"fwd", "bwd", "loss"}
    assert all(0 < f.value < 5 for f in floors.values())
    assert "no-grad forward" in floors["fwd"].note and "backward" in floors["bwd"].note
