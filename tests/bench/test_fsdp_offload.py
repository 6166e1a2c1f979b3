"""The FSDP2 + CPUOffloadPolicy baseline runs end to end on the CPU (gloo, a one-rank CPU mesh):
the same code path as on the GPU except the device, the backend and unpinned host memory."""

import json
import math

import pytest
import torch.distributed as dist

from bench.speed.fsdp_offload import SYSTEM, fsdp2_offload_point, main
from slide_ir.specs.model_catalog import load_model


@pytest.fixture(autouse=True)
def _own_process_group():
    """Each test starts without a default process group and leaves none behind."""
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_point_on_cpu():
    row = fsdp2_offload_point(load_model("tiny-llama"), batch=2, seq=32, steps=2, device="cpu")
    assert "skipped" not in row, row
    assert row["system"] == SYSTEM and row["model"] == "tiny-llama" and row["batch"] == 2
    assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0
    assert row["step_time_s"] > 0
    assert len(row["losses"]) == 2 and all(math.isfinite(x) for x in row["losses"])
    # random init over a 512-token vocabulary: the loss starts near ln(512)
    assert abs(row["losses"][0] - math.log(512)) < 1.0
    assert row["optimizer"].startswith("AdamW(")
    assert row["gpu_peak_allocated"] == 0 and row["cpu_peak_rss"] > 0


@pytest.mark.timeout(120)
def test_main_appends_rows(tmp_path):
    out = tmp_path / "rows.jsonl"
    out.write_text('{"system": "earlier"}\n')
    args = ["--model", "tiny-llama", "--batch", "1,2", "--seq", "16", "--steps", "2"]
    main([*args, "--device", "cpu", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["system"] for r in rows] == ["earlier", SYSTEM, SYSTEM]
    assert [r["batch"] for r in rows[1:]] == [1, 2]
    assert not dist.is_initialized()
