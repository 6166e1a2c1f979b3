"""`slide simulate`, `sweep`, `critical-batch`, `capacity`, `compare` through `main([...])`."""

import json
import re

import pytest

from slide.cli import main
from slide_ir.ir.trace import Trace

SMALL = ("--model", "qwen2.5-3b", "--machine", "paper-pc-4090", "--seq", "512")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_json_has_the_documented_keys(capsys):
    code, out, _ = run(capsys, "simulate", *SMALL, "--batch", "8", "--json")
    assert code == 0
    doc = json.loads(out)
    for key in (
        "step_time_s",
        "tokens_per_s",
        "tflops",
        "eta",
        "t_bwd_s",
        "t_d2h_s",
        "t_update_s",
        "gpu_util",
        "bottleneck",
        "memory",
        "feasible",
    ):
        assert key in doc, key
    assert doc["feasible"] is True
    assert set(doc["memory"]) == {"gpu", "cpu", "nvme"}
    assert doc["eta"] == pytest.approx(doc["t_bwd_s"] / (doc["t_d2h_s"] + doc["t_update_s"]))
    assert doc["tokens_per_s"] == pytest.approx(8 * 512 / doc["step_time_s"])


def test_simulate_writes_gantt_and_chrome_trace(capsys, tmp_path):
    gantt, chrome, saved = tmp_path / "g.png", tmp_path / "t.json", tmp_path / "trace.json"
    code, out, _ = run(
        capsys,
        "simulate",
        *SMALL,
        "--batch",
        "4",
        "--steps",
        "2",
        "--gantt",
        str(gantt),
        "--trace",
        str(chrome),
        "--save-trace",
        str(saved),
    )
    assert code == 0
    assert "eta" in out and "bottleneck" in out and f"written to {gantt}" in out
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(chrome.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name"} >= {"gpu", "cpu"}
    assert Trace.from_json(saved.read_text()).info.model == "qwen2.5-3b"


def test_infeasible_is_reported_not_simulated(capsys):
    code, out, _ = run(
        capsys, "simulate", "--model", "qwen2.5-72b", "--machine", "paper-pc-4090", "--json"
    )
    assert code == 1
    doc = json.loads(out)
    assert doc["feasible"] is False and "step_time_s" not in doc
    assert {o["tier"] for o in doc["overflows"]} >= {"cpu"}
    assert all(o["bytes_over"] > 0 for o in doc["overflows"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("simulate", "--model", "nope-7b"), "unknown model 'nope-7b'"),
        (("simulate", "--batch", "0"), "batch must be a positive integer"),
        (("simulate", "--gantt-zoom", "x"), "--gantt-zoom must be"),
        (("simulate", "--gantt-zoom", "4"), "a step number 1 to 3 (--steps 3), got '4'"),
        (("sweep", "--batch", "1,x"), "--batch must be a comma list of integers"),
        (("sweep", "--schedules", "fast"), "--schedules: each must be one of"),
        (("compare", "--model", "qwen2.5-3b"), "give at least one --machine"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_sweep_table_and_plot(capsys, tmp_path):
    plot = tmp_path / "sweep.png"
    code, out, _ = run(
        capsys,
        "sweep",
        *SMALL,
        "--batch",
        "2,8",
        "--steps",
        "2",
        "--schedules",
        "sliding,zero-offload",
        "--plot",
        str(plot),
    )
    assert code == 0
    lines = out.splitlines()
    assert "tokens_per_s" in lines[0] and len([x for x in lines if "qwen2.5-3b" in x]) == 4
    assert lines[0].split()[-2:] == ["gpu_gib", "cpu_gib"]  # as `slide plan` counts memory
    fits = [x for x in lines if "qwen2.5-3b" in x and "does not fit" not in x]
    assert fits
    for row in fits:  # tokens/s: no decimals to read as a thousands separator
        assert re.fullmatch(r"[\d,]+", row.split()[5]), row
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_sweep_json_over_nvme_drives(capsys):
    code, out, _ = run(
        capsys,
        "sweep",
        *SMALL,
        "--batch",
        "8",
        "--nvme",
        "1,2",
        "--optimizer",
        "nvme",
        "--steps",
        "2",
        "--json",
    )
    assert code == 0
    rows = json.loads(out)
    assert [r["nvme_drives"] for r in rows] == [1, 2]
    assert rows[1]["tokens_per_s"] > rows[0]["tokens_per_s"]


def test_critical_batch_json(capsys):
    code, out, _ = run(capsys, "critical-batch", *SMALL, "--steps", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    cb = doc["critical_batch"]
    assert cb is not None and cb >= 1
    points = {p["batch"]: p for p in doc["points"]}
    assert points[cb]["eta"] >= 1.0
    if cb - 1 in points:
        assert points[cb - 1]["eta"] < 1.0
    assert doc["critical_batch_util97"] is not None


def test_critical_batch_where_no_batch_fits_exits_1_and_says_so(capsys):
    code, out, _ = run(capsys, "critical-batch", "--model", "llama-3.1-405b", "--steps", "2")
    assert code == 1
    assert "critical batch (eta >= 1):              none: no batch fits" in out
    assert "largest batch that fits:                none (not even batch 1" in out


def test_capacity_json(capsys):
    code, out, _ = run(capsys, "capacity", "--machine", "paper-pc-4090", "--json")
    assert code == 0
    doc = json.loads(out)
    by_place = {(p["activations"], p["optimizer"], p["moments"]): p for p in doc["placements"]}
    cpu, nvme = by_place[("cpu", "cpu", "fp32")], by_place[("nvme", "nvme", "fp32")]
    assert cpu["largest_model"] is not None
    assert nvme["largest_model_params"] >= cpu["largest_model_params"]
    for fam in cpu["families"].values():
        assert fam["scaled_params"] >= fam["largest_member_params"]


def test_capacity_where_nothing_fits_says_so(capsys):
    code, out, _ = run(capsys, "capacity", "--machine", "paper-pc-4090", "--ram-gb", "1")
    assert code == 0 and "None" not in out
    assert "  llama-3.1      largest member none             no depth fits" in out


def test_capacity_grows_with_ram(capsys):
    sizes = []
    for ram in ("64", "512"):
        code, out, _ = run(
            capsys,
            "capacity",
            "--machine",
            "paper-pc-4090",
            "--ram-gb",
            ram,
            "--optimizer",
            "cpu",
            "--activations",
            "cpu",
            "--json",
        )
        assert code == 0
        sizes.append(json.loads(out)["placements"][0]["largest_model_params"])
    assert sizes[1] > sizes[0]


def test_compare_ranks_by_throughput(capsys):
    code, out, _ = run(
        capsys,
        "compare",
        "--model",
        "qwen2.5-3b",
        "--machine",
        "paper-pc-4090",
        "--machine",
        "h200-16c-128g,paper-server-a100",
        "--batch",
        "8",
        "--seq",
        "512",
        "--steps",
        "2",
        "--json",
    )
    assert code == 0
    rows = json.loads(out)
    assert [r["rank"] for r in rows] == [1, 2, 3]
    tps = [r["tokens_per_s"] for r in rows]
    assert tps == sorted(tps, reverse=True)
    priced = [r for r in rows if r["price_usd"]]
    assert all(
        r["tokens_per_s_per_usd"] == pytest.approx(r["tokens_per_s"] / r["price_usd"])
        for r in priced
    )


def test_gantt_zooms_to_a_step_and_refuses_unknown_steps(tmp_path):
    from simulator.run import simulate_plan
    from slide.gantt import plot_gantt, step_window
    from slide_ir.specs.config import TrainConfig

    trace = simulate_plan("llama-3.2-1b", "paper-pc-4090", TrainConfig(batch=2, seq=256)).trace
    lo, hi = step_window(trace, 2)
    assert 0 < lo < hi
    assert plot_gantt(trace, tmp_path / "z.png", zoom=2).stat().st_size > 10_000
    with pytest.raises(ValueError, match="step must be one of"):
        plot_gantt(trace, tmp_path / "bad.png", zoom=7)


# -- sweep: a plot only when asked, a progress bar, legends that name drives ---------------------
def test_sweep_writes_nothing_unasked_and_shows_progress(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "sweep", *SMALL, "--batch", "2,4", "--steps", "2")
    assert code == 0 and "tokens_per_s" in out and "plot" not in out
    assert list(tmp_path.iterdir()) == []
    assert "sweep" in err and "2/2" in err  # tqdm's bar, on stderr
    code, out, err = run(capsys, "sweep", *SMALL, "--batch", "2,4", "--steps", "2", "--no-progress")
    assert code == 0 and err == ""


def test_sweep_names_drive_counts_in_series_and_legend(capsys, tmp_path, monkeypatch):
    from slide import gantt

    figures = []
    monkeypatch.setattr(gantt.plt, "close", figures.append)  # keep the figure to read its legend
    argv = ("--batch", "2,8", "--nvme", "1,2", "--optimizer", "nvme", "--steps", "2")
    plot = tmp_path / "drives.png"
    code, out, _ = run(capsys, "sweep", *SMALL, *argv, "--json", "--plot", str(plot))
    assert code == 0 and plot.read_bytes()[:4] == b"\x89PNG"
    assert [r["series"] for r in json.loads(out)] == ["1 drive", "1 drive", "2 drives", "2 drives"]
    (fig,) = figures
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "1 drive: tokens/s" in labels and "2 drives: tokens/s" in labels


# -- critical-batch: "largest batch that fits" is what `slide plan` says ----------------------------
@pytest.mark.parametrize(
    ("activations", "placement"), [("auto", "small"), ("cpu", "small"), ("auto", "fast")]
)
def test_largest_fitting_batch_agrees_with_plan(capsys, activations, placement):
    flags = ("--model", "llama-3.1-8b", "--machine", "h200-16c-128g", "--activations", activations,
             "--placement", placement)  # fmt: skip
    code, out, _ = run(capsys, "critical-batch", *flags, "--steps", "2", "--json")
    assert code == 0
    largest = json.loads(out)["max_feasible_batch"]
    assert largest >= 1
    for batch, fits in ((largest, True), (largest + 1, False)):
        code, out, _ = run(capsys, "plan", *flags, "--batch", str(batch), "--json")
        assert json.loads(out)["feasible"] is fits and code == (0 if fits else 1), batch
    if activations == "auto" and placement == "small":  # the table says the same
        code, out, _ = run(capsys, "critical-batch", *flags, "--steps", "2")
        assert f"largest batch that fits:                {largest}\n" in out


def test_sweep_in_processes_equals_one_process(capsys):
    argv = ("sweep", *SMALL, "--batch", "2,4,8", "--steps", "2", "--json", "--no-progress")
    code_one, one, _ = run(capsys, *argv, "--jobs", "1")
    code_two, two, _ = run(capsys, *argv, "--jobs", "2")
    assert code_one == code_two == 0
    assert json.loads(two) == json.loads(one)  # same rows, same order
    code, _, err = run(capsys, *argv, "--jobs", "0")
    assert code == 2 and "--jobs must be >= 1, got 0" in err


def test_capacity_shows_host_bytes_per_param_beside_slideformers_rule(capsys):
    from slide_ir import TrainConfig, load_machine, load_model
    from slide_ir.planning.placement import smallest_ledger
    from slide_ir.planning.slideformer_footprint import slideformer_host_bytes

    argv = ["capacity", "--machine", "paper-pc-4090", "--ram-gb", "128", "--optimizer", "cpu",
            "--activations", "cpu"]  # fmt: skip
    code, text, _ = run(capsys, *argv)
    code_json, out, _ = run(capsys, *argv, "--json")
    assert code == code_json == 0
    place = json.loads(out)["placements"][0]
    model = load_model(place["largest_model"])
    machine = load_machine("paper-pc-4090", ram_gb=128)
    config = TrainConfig(batch=1, seq=1024, clip="global")  # `slide train`'s default
    host = smallest_ledger(model, machine, config).peak_bytes("cpu")
    assert place["host_bytes_per_param"] == pytest.approx(host / model.total_params, abs=1e-3)
    assert f"host RAM {host / model.total_params:.1f} B/param" in text
    theirs = sum(slideformer_host_bytes(model, config).values()) / model.total_params
    assert place["slideformer_host_bytes_per_param"] == pytest.approx(theirs, abs=1e-3)
    assert f"SlideFormer, as its code allocates: {theirs:.1f} B/param for the same model" in text
    best = load_model(place["slideformer_largest_model"])
    assert sum(slideformer_host_bytes(best, config).values()) <= 0.95 * 128 * 2**30


def _capacity_modes(capsys, *argv):
    code, out, _ = run(capsys, "capacity", "--machine", "paper-pc-4090", "--ram-gb", "128",
                       "--activations", "cpu", *argv, "--json")  # fmt: skip
    assert code == 0
    return {(p["optimizer"], p["moments"]): p for p in json.loads(out)["placements"]}


def test_capacity_reports_both_moment_precisions_as_modes(capsys):
    modes = _capacity_modes(capsys, "--optimizer", "cpu")
    assert set(modes) == {("cpu", "fp32"), ("cpu", "bf16")}
    fp32, bf16 = modes[("cpu", "fp32")], modes[("cpu", "bf16")]
    assert bf16["largest_model_params"] >= fp32["largest_model_params"]
    for name, fam in bf16["families"].items():
        assert fam["scaled_params"] >= fp32["families"][name]["scaled_params"], name
    if fp32["largest_model"] == bf16["largest_model"]:  # SlideFormer's moments: 8 B -> 4 B
        theirs = [m["slideformer_host_bytes_per_param"] for m in (fp32, bf16)]
        assert theirs[0] - theirs[1] == pytest.approx(4, abs=2e-3)
    code, text, _ = run(capsys, "capacity", "--machine", "paper-pc-4090", "--optimizer", "cpu",
                        "--activations", "cpu")  # fmt: skip
    assert code == 0
    assert "optimizer on cpu, FP32 moments:" in text and "optimizer on cpu, BF16 moments:" in text
    assert "(SlideFormer, as its code allocates: " in text


def test_capacity_moments_flag_picks_one_mode_and_slideformer_keeps_its_master_in_ram(capsys):
    """SlideFormer's NVMe tier takes the moments only: with the optimizer on NVMe its answer is
    its moments-on-NVMe one, and Slide's, with the master on the drive too, a larger model."""
    modes = _capacity_modes(capsys, "--moments", "bf16")
    assert {m for _, m in modes} == {"bf16"}
    nvme, moments = modes[("nvme", "bf16")], modes[("nvme-moments", "bf16")]
    assert nvme["slideformer_largest_model"] == moments["slideformer_largest_model"]
    assert nvme["largest_model_params"] > nvme["slideformer_largest_model_params"]
    for mode in modes.values():  # the same model at no more host RAM than SlideFormer's
        assert mode["host_bytes_per_param"] <= mode["slideformer_host_bytes_per_param"]


def test_capacity_answers_for_trains_default_clipping_and_clip_changes_it(capsys):
    """Global clipping holds every host-updated gradient until the norm (2 B/param of landing):
    capacity under `slide train`'s default is never larger than without clipping."""
    default = _capacity_modes(capsys, "--optimizer", "cpu", "--moments", "fp32", "--nvme", "0")
    none = _capacity_modes(capsys, "--optimizer", "cpu", "--moments", "fp32", "--nvme", "0",
                           "--clip", "none")  # fmt: skip
    glob, bare = default[("cpu", "fp32")], none[("cpu", "fp32")]
    assert glob["largest_model_params"] <= bare["largest_model_params"]
    assert (
        glob["families"]["llama-3.1"]["scaled_params"]
        < bare["families"]["llama-3.1"]["scaled_params"]
    )
    code, text, _ = run(capsys, "capacity", "--machine", "paper-pc-4090", "--optimizer", "cpu",
                        "--activations", "cpu", "--clip", "per-unit")  # fmt: skip
    assert code == 0 and text.startswith("paper-pc-4090: batch 1 x seq 1024, --clip per-unit;")


def test_a_drive_holds_global_clippings_gradients_for_the_optimizer_in_ram(capsys):
    """With the optimizer in RAM, a drive takes the held gradients where RAM does not: the
    default clipping's capacity with a drive reaches the unclipped one's."""

    def largest(*argv):  # type: ignore[no-untyped-def]
        modes = _capacity_modes(capsys, "--optimizer", "cpu", "--moments", "fp32", *argv)
        return modes[("cpu", "fp32")]["families"]["llama-3.1"]["scaled_params"]

    assert largest() > largest("--nvme", "0")  # the preset's one drive, and none
    assert largest() == largest("--clip", "none")


def test_capacity_refuses_a_bad_moments_value(capsys):
    with pytest.raises(SystemExit) as stop:  # argparse's usage and one error line
        main(["capacity", "--moments", "fp16"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert "--moments: invalid choice: 'fp16' (choose from 'fp32', 'bf16')" in err
