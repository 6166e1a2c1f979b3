"""`slide plan/simulate --nproc N` through `main([...])`: data-parallel predictions on one node."""

import json

import pytest

from slide.cli import main

TINY = ("--model", "tiny-llama", "--machine", "h200-16c-128g", "--seq", "64", "--steps", "2")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_nproc_1_is_todays_output_exactly(capsys, command):
    _, plain, _ = run(capsys, command, *TINY, "--batch", "4")
    _, one, _ = run(capsys, command, *TINY, "--batch", "4", "--nproc", "1")
    assert one == plain


def test_plan_shows_per_rank_gpu_per_host_ram_and_the_net_lane(capsys):
    code, out, _ = run(capsys, "plan", *TINY, "--batch", "4", "--nproc", "2")
    assert code == 0
    assert "2 data-parallel ranks" in out and "global batch 4 = 2 ranks x batch 2" in out
    assert "per rank" in out and "per host (2 x" in out
    assert "net lane: reduce-scatter" in out and "NVLink" in out
    code, out, _ = run(capsys, "plan", *TINY, "--batch", "4", "--nproc", "2", "--json")
    dp = json.loads(out)["data_parallel"]
    assert dp["nproc"] == 2 and dp["rank_batch"] == 2 and dp["global_batch"] == 4
    assert dp["net_bytes_per_step"] > 0 and dp["collectives"]["reduce_scatter"] > 0
    assert dp["host_bytes_per_host"] == 2 * dp["host_bytes_per_rank"]


def test_simulate_reports_the_global_batch_and_the_net_lane(capsys, tmp_path):
    gantt = tmp_path / "dp.png"
    code, out, _ = run(capsys, "simulate", *TINY, "--batch", "4", "--nproc", "2",
                       "--gantt", str(gantt))  # fmt: skip
    assert code == 0, out
    assert "tokens/s for the global batch" in out and "net lane busy" in out
    assert gantt.stat().st_size > 0
    code, out, _ = run(capsys, "simulate", *TINY, "--batch", "4", "--nproc", "2", "--json")
    s = json.loads(out)
    assert s["batch"] == 4 and s["data_parallel"]["rank_batch"] == 2
    assert "net" in s["lane_util"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--nproc", "0"), "from 1 to 8"),
        (("--nproc", "9"), "from 1 to 8"),
        (("--nproc", "3"), "multiple of 3"),
        (("--nproc", "2", "--schedule", "gpu-only"), "sliding"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_bad_nproc_is_one_clear_line(capsys, command, argv, message):
    code, out, err = run(capsys, command, *TINY, "--batch", "4", *argv)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_readme_example_says_the_link_its_plan_uses(capsys):
    """The README's multi-GPU example and its plan agree on the interconnect."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    example = "slide plan --model llama-3.1-8b --machine h200-16c-128g --batch 32 --nproc 4"
    comment = readme[: readme.index(example)].rsplit("# several GPUs of one node", 1)[1]
    code, out, _ = run(capsys, *example.split()[1:])
    link = next(line for line in out.splitlines() if line.startswith("interconnect"))
    assert code == 0 and link.startswith("interconnect NVLink, 370 GB/s")
    assert "NVLink (370 GB/s" in comment and "PCIe 5.0 for the host link" in comment


def test_a_host_overflow_names_the_ram_that_holds_every_rank(capsys):
    """8B at a small RAM on two ranks: the advice's --ram-gb makes the same run fit."""
    argv = ("plan", "--model", "llama-3.1-8b", "--machine", "h200-16c-128g", "--placement",
            "small", "--clip", "none", "--nproc", "2", "--ram-gb", "64")  # fmt: skip
    code, out, _ = run(capsys, *argv)
    assert code == 1 and "verdict: does not fit (cpu by" in out
    line = next(x for x in out.splitlines() if "more host RAM for the 2 ranks" in x)
    ram = line.rsplit("--ram-gb ", 1)[1].rstrip(")")
    code, out, _ = run(capsys, *argv[:-1], ram)
    assert code == 0 and "verdict: fits" in out
