"""`slide demo` (the README's main command) through `main([...])`, without CUDA: it predicts
what `slide simulate` predicts with train's defaults and writes its three files."""

import json
import re

from slide.cli import main


def _line(out: str, name: str) -> str:
    return re.search(rf"^{name}\s+(.*)$", out, re.M).group(1)


def test_demo_predicts_what_simulate_predicts_with_the_defaults(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(["demo", "--out", str(tmp_path / "demo"), "--batch", "8"]) == 0
    demo = capsys.readouterr().out
    assert main(["simulate", "--model", "llama-3.1-8b", "--machine", "paper-pc-4090",
                 "--batch", "8"]) == 0  # fmt: skip
    simulate = capsys.readouterr().out
    assert _line(demo, "step time") == _line(simulate, "step time")
    assert "global clipping" in demo
    plan = json.loads((tmp_path / "demo" / "plan.json").read_text())
    assert (plan["model_name"], plan["config"]["clip"]) == ("llama-3.1-8b", "global")
    assert (tmp_path / "demo" / "gantt.png").stat().st_size > 0
    assert json.loads((tmp_path / "demo" / "trace.json").read_text())
    assert "skipped the real fine-tune of tiny-llama: no CUDA device" in demo


def test_a_batch_that_does_not_fit_names_the_batch_and_the_tier(capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--batch", "200"]) != 0
    err = capsys.readouterr().err
    assert re.search(r"batch 200 does not fit paper-pc-4090 \(gpu by [\d.]+ GiB\): try a smaller "
                     r"--batch", err)  # fmt: skip
    assert not (tmp_path / "demo").exists()
