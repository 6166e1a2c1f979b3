"""`slide plan`, `slide models`, `slide machines` through `main([...])`, as a user runs them."""

import json
import os
import re
import subprocess
import sys

import pytest

from slide.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_has_the_documented_keys(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "llama-3.1-8b",
        "--machine",
        "paper-pc-4090",
        "--batch",
        "16",
        "--seq",
        "1024",
        "--clip",
        "none",
        "--json",
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["model"] == {"name": "llama-3.1-8b", "params": 8_030_261_248, "layers": 32}
    for tier in ("gpu", "cpu", "nvme"):
        assert {"peak_bytes", "capacity_bytes", "breakdown"} <= doc["memory"][tier].keys()
        assert sum(doc["memory"][tier]["breakdown"].values()) == doc["memory"][tier]["peak_bytes"]
    assert doc["memory"]["cpu"]["peak_bytes"] >= 12 * doc["model"]["params"]
    assert 0 < doc["memory"]["cpu"]["pinned_bytes"] < doc["memory"]["cpu"]["peak_bytes"]
    assert doc["feasible"] is True
    # the placement search keeps the embedding and two layers on the 4090 (2,505 tokens/s
    # predicted against 2,282 with every unit sliding) and streams nothing
    placement = doc["placement"]
    assert placement["how"] == "searched"
    assert placement["chosen"]["resident_units"] == doc["resident_units"] == [0, 1, 2]
    assert doc["streamed_units"] == []
    assert doc["config"]["resident"] == 3 and doc["config"]["cache_units"] == 2
    assert placement["chosen"]["predicted_step_s"] < placement["legacy"]["predicted_step_s"]
    assert placement["chosen"]["predicted_step_s"] <= placement["runner_up"]["predicted_step_s"]
    assert doc["graph"]["ops_per_lane"]["cpu"] == 3 * (34 - 3)


def test_plan_human_output_names_terms(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "llama-3.1-8b",
        "--machine",
        "paper-pc-4090",
        "--batch",
        "16",
        "--seq",
        "1024",
        "--placement",
        "small",
    )
    assert code == 0
    assert "fp32 master weights" in out and "29.92 GiB" in out
    assert "Adam moments" in out and "59.83 GiB" in out
    assert "verdict: fits" in out


def test_plan_says_what_the_placement_search_chose_and_the_runner_up(capsys):
    argv = ("plan", "--model", "llama-3.1-8b", "--machine", "h200-16c-128g",
            "--keep-activations", "auto", "--clip", "none")  # fmt: skip
    code, out, _ = run(capsys, *argv)
    assert code == 0
    lines = out.splitlines()
    assert lines[2] == (
        "placement: 26 resident, 0 streamed, 8 sliding units; inputs on cpu, 6 cache units; "
        "19 kept tapes"
    )
    code, raw, _ = run(capsys, *argv, "--json")  # the text says what the JSON holds
    searched = json.loads(raw)["placement"]
    step = searched["chosen"]["predicted_step_s"]
    assert (
        f"placements that fit: {step:.3f} s/step predicted ({16384 / step:,.0f} tokens/s)"
        in lines[3]
    )
    assert lines[4].startswith("  runner-up: ") and " s/step (+" in lines[4]
    legacy = searched["legacy"]["predicted_step_s"]
    assert "the default before): 0 resident, 22 streamed" in lines[5]
    assert f"{legacy:.3f} s/step" in lines[5] and legacy > 1.3 * step
    code, out, _ = run(capsys, *argv, "--placement", "small")
    assert code == 0
    assert (
        "placement: 0 resident, 0 streamed, 34 sliding units; inputs on cpu, 3 cache units" in out
    )
    assert "(--placement small: the smallest footprint)" in out
    small = _told_step(out)
    code, out, _ = run(capsys, *argv, "--resident", "4", "--streamed", "2", "--activations",
                       "cpu", "--cache-units", "3", "--keep-activations", "0")  # fmt: skip
    assert "placement: 4 resident, 2 streamed, 28 sliding units" in out and "(as given" in out
    assert step < _told_step(out) < small  # placements no search timed are timed too


def _told_step(out: str) -> float:
    """The predicted step printed under a placement the search did not time."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("placement: "))
    assert lines[at + 1].startswith("  ") and " s/step predicted (" in lines[at + 1]
    return float(lines[at + 1].split()[0])


def test_gpu_memory_cap_is_respected_and_reported(capsys):
    argv = ("plan", "--model", "llama-3.1-8b", "--machine", "h200-16c-128g", "--json")
    code, out, _ = run(capsys, *argv, "--gpu-memory-gb", "40")
    doc = json.loads(out)
    assert code == 0 and doc["memory"]["gpu"]["capacity_bytes"] == 40 * 2**30
    assert doc["memory"]["gpu"]["peak_bytes"] <= 0.95 * 40 * 2**30
    assert 0 < len(doc["resident_units"]) < 23  # fewer than without the cap
    code, out, _ = run(capsys, *argv, "--gpu-memory-gb", "1", "--placement", "small")
    assert code == 1 and json.loads(out)["overflows"].keys() == {"gpu"}


def test_infeasible_plan_says_which_tier_and_what_would_fit(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "llama-3.1-8b",
        "--machine",
        "paper-pc-4090",
        "--batch",
        "64",
        "--activations",
        "gpu",
        "--ram-gb",
        "64",
    )
    assert code == 1  # a result, printed in full, with its verdict: not a user error (2)
    assert "does not fit" in out and "gpu by" in out and "cpu by" in out
    assert "--activations cpu" in out or "--batch" in out
    assert "--optimizer nvme" in out


def test_plan_writes_a_reloadable_plan(tmp_path, capsys):
    from slide_ir.planning.planner import plan_from_json

    out_file = tmp_path / "plans" / "p.json"
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        "qwen2.5-0.5b",
        "--batch",
        "2",
        "--seq",
        "128",
        "--out",
        str(out_file),
    )
    assert code == 0 and str(out_file) in out
    p = plan_from_json(out_file.read_text())
    assert p.model.name == "qwen2.5-0.5b" and p.config.batch == 2


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "llama-3.1-8", "--batch", "1"], "llama-3.1-8b"),  # close match listed
        (["--machine", "paper-pc-409", "--batch", "1"], "paper-pc-4090"),
        (["--batch", "0"], "batch must be a positive integer"),
        (["--seq", "-5"], "seq must be a positive integer"),
        (["--resident", "lots"], "resident must be a count"),
        (["--cache-units", "1"], "cache_units must be >= 2 (one computing, one prefetching)"),
        (["--cache-units", "deep"], "cache_units must be a count >= 2 or 'auto', got 'deep'"),
        (["--gpu-memory-gb", "0"], "gpu_memory_gb must be a number of GiB > 0"),
        (["--gpu-memory-gb", "-3"], "gpu_memory_gb must be a number of GiB > 0"),
        (
            ["--gpu-memory-gb", "100"],
            "--gpu-memory-gb 100 is more than paper-pc-4090's GPU has "
            "(24.0 GiB): give at most 24.0",
        ),
        (["--optimizer", "nvme", "--nvme", "0"], "need at least one NVMe drive"),
        (["--clip", "none", "--speculate", "3"], "--speculate 3: only global clipping's updates"),
    ],
)
def test_user_errors_exit_2_with_one_line(capsys, argv, needle):
    code, _out, err = run(capsys, "plan", *argv)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_malformed_config_names_the_file(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": ')
    code, _, err = run(capsys, "plan", "--model", str(bad))
    assert code == 2 and str(bad) in err


def test_malformed_machine_toml_names_the_file(tmp_path, capsys):
    bad = tmp_path / "box.toml"
    bad.write_text("[gpu]\npreset = \n")
    code, _, err = run(capsys, "plan", "--machine", str(bad))
    assert code == 2 and str(bad) in err


def test_catalog_listings(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0 and "mistral-large-2" in out and "122.61B" in out
    code, out, _ = run(capsys, "machines")
    assert code == 0 and "paper-server-a100" in out and "h200-16c-128g" in out


def test_72b_on_the_4090_pc_gets_a_gpu_suggestion_that_fits(capsys):
    """72B's GPU overflow on a 24 GiB card is fixed by the batch the advice names."""
    code, out, _ = run(capsys, "plan", "--model", "qwen2.5-72b", "--machine", "paper-pc-4090")
    assert code == 1
    line = next(x for x in out.splitlines() if "(--batch" in x or "--cache-units 2 --batch" in x)
    flags = line.rsplit("(", 1)[1].rstrip(")").split()
    code, out, _ = run(
        capsys, "plan", "--model", "qwen2.5-72b", "--machine", "paper-pc-4090", *flags, "--json"
    )
    assert json.loads(out)["overflows"].keys() == {"cpu"}  # the GPU now fits; the RAM never did


@pytest.mark.parametrize("extra", [(), ("--optimizer", "nvme")])
def test_the_nvme_advice_names_drives_that_hold_it(capsys, extra):
    """70B on the H200 box (one 64 GiB drive): the move to NVMe, and more NVMe, name the drive
    count that holds the files, and the plan with those flags fits."""
    argv = ("plan", "--model", "llama-3.1-70b", "--machine", "h200-16c-128g", *extra)
    code, out, _ = run(capsys, *argv)
    assert code == 1
    line = next(x for x in out.splitlines() if "--nvme " in x)
    flags = re.search(r"\(((?:--\S+ \S+ ?)+)\)$", line).group(1).split()
    code, out, _ = run(capsys, *argv, *flags, "--json")
    assert code == 0 and not json.loads(out)["overflows"]


def test_a_ram_overflow_of_global_clipping_is_told_per_unit_clipping_fits(capsys):
    """70B with its optimizer on NVMe on the 4090 PC with 170 GiB: under global clipping with
    every gradient waiting in RAM for the norm (141 GB of them), the advice names the clipping,
    and the place for the held gradients, that fit."""
    argv = ("plan", "--model", "llama-3.1-70b", "--machine", "paper-pc-4090", "--ram-gb", "170",
            "--optimizer", "nvme", "--cache-units", "2")  # fmt: skip
    code, out, _ = run(capsys, *argv, "--held-grads", "ram")
    assert code == 1
    lines = out.splitlines()
    assert any("(--clip per-unit)" in line for line in lines)
    assert any("(--held-grads nvme)" in line for line in lines)
    for fix in (("--clip", "per-unit"), ("--held-grads", "nvme")):
        code, out, _ = run(capsys, *argv, *fix, "--json")
        assert "cpu" not in json.loads(out)["overflows"], fix
    code, out, _ = run(capsys, *argv)  # auto: the drives, where RAM does not hold them
    assert code == 0 and "held gradients (NVMe)" in out


def test_plan_compares_with_the_baseline_schedules(capsys):
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "--json")
    assert code == 0
    base = json.loads(out)["baselines"]
    params = 8_030_261_248
    assert base["gpu-only"]["gpu"] > 16 * params  # weights, grads, master, moments + activations
    # BF16 weights on the GPU, gradients through DeepSpeed's reduce bucket
    assert 2 * params < base["zero-offload"]["gpu"] < 4 * params
    assert base["zero-offload"]["cpu"] > 16 * params  # FP32 grads, master, moments; BF16 copy
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b")
    assert code == 0 and "for comparison, the same run needs: gpu-only GPU" in out
    code, out, _ = run(capsys, "plan", "--model", "llama-3.1-8b", "--clip", "global")
    assert code == 0 and "for comparison, the same run needs: gpu-only GPU" in out


# -- exit status: 0 fits, 1 does not fit (a result, printed), 2 a user error ---------------------
FITS = ("--model", "qwen2.5-0.5b", "--machine", "paper-pc-4090", "--batch", "2", "--seq", "128")
TOO_BIG = ("--model", "qwen2.5-72b", "--machine", "paper-pc-4090")


@pytest.mark.parametrize("command", ["plan", "simulate"])
@pytest.mark.parametrize("as_json", [False, True])
def test_plan_and_simulate_share_one_exit_rule(capsys, command, as_json):
    extra = ("--steps", "2", "--json") if as_json else ("--steps", "2")
    code, out, err = run(capsys, command, *FITS, *extra)
    assert (code, err) == (0, "")
    code, out, err = run(capsys, command, *TOO_BIG, *extra)
    assert code == 1 and err == ""
    if as_json:
        assert json.loads(out)["feasible"] is False
    else:
        assert "does not fit" in out  # the plan is still shown, with its verdict
    code, _, err = run(capsys, command, *FITS, "--batch", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_help_states_the_exit_rule(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    assert "exit status: 0" in text and "; 1 it does not fit" in text
    assert "2 a user error" in text


# -- --nvme-dir: one directory per drive --------------------------------------------------------
NVME_PLAN = (*FITS, "--optimizer", "nvme", "--json")


def nvme_capacity(capsys, *argv):
    code, out, err = run(capsys, "plan", *NVME_PLAN, *argv)
    assert code == 0, err
    return json.loads(out)["memory"]["nvme"]["capacity_bytes"]


def test_nvme_dirs_set_the_drive_count(capsys, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    one = nvme_capacity(capsys, "--nvme", "1")
    two = nvme_capacity(capsys, "--nvme", "2")
    assert two == 2 * one
    assert nvme_capacity(capsys, "--nvme-dir", str(a)) == one
    assert nvme_capacity(capsys, "--nvme-dir", str(a), "--nvme-dir", str(b)) == two
    assert nvme_capacity(capsys, "--nvme-dir", str(a), "--nvme-dir", str(b), "--nvme", "2") == two
    code, out, _ = run(
        capsys, "simulate", *FITS, "--steps", "2", "--optimizer", "nvme", "--json",
        "--nvme-dir", str(a), "--nvme-dir", str(b),
    )  # fmt: skip
    assert code == 0 and json.loads(out)["capacity"]["nvme"] == two


def test_bad_nvme_dirs_are_one_line_errors(capsys, tmp_path):
    a, b, f = tmp_path / "a", tmp_path / "b", tmp_path / "file"
    a.mkdir()
    b.mkdir()
    f.write_text("x")
    cases = [
        (["--nvme-dir", str(a), "--nvme", "2"], "--nvme 2 disagrees with the 1 --nvme-dir"),
        (["--nvme-dir", str(tmp_path / "nope")], f"--nvme-dir {tmp_path / 'nope'}: no such"),
        (["--nvme-dir", str(f)], f"--nvme-dir {f}: not a directory"),
        (["--nvme-dir", str(a), "--nvme-dir", f"{b}/../a"], "names the same directory as"),
    ]
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        cases.append((["--nvme-dir", str(ro)], f"--nvme-dir {ro}: not writable"))
    for command in ("plan", "simulate"):
        for argv, needle in cases:
            code, out, err = run(capsys, command, *FITS, "--optimizer", "nvme", *argv)
            assert code == 2 and out == "", argv
            assert needle in err and len(err.strip().splitlines()) == 1, err


# -- a closed pipe ends the command quietly -------------------------------------------------------
def test_output_into_head_exits_quietly():
    """`slide ... | head -n 1`: the reader leaves after one line; more than a pipe buffer (64 KiB)
    of output is still to come, so the next write fails with EPIPE."""
    batches = ",".join(str(b) for b in range(1, 101))  # ~150 kB of JSON
    argv = [sys.executable, "-m", "slide.cli", "sweep", "--model", "tiny-llama", "--batch"]
    slide = subprocess.Popen(
        [*argv, batches, "--steps", "2", "--json", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # a guard against a hang, not a speed test: 100 plans take ~45 s on a 2-core machine
    head = subprocess.run(["head", "-n", "1"], stdin=slide.stdout, capture_output=True, timeout=300)
    slide.stdout.close()  # head holds the only reader now
    err = slide.stderr.read().decode()
    assert slide.wait(timeout=300) == 0, err
    assert head.stdout == b"[\n"
    assert err == ""  # no traceback, no "Exception ignored ... BrokenPipeError"


def test_plan_names_each_drive_file_and_its_bytes(capsys, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    argv = ("--optimizer", "nvme", "--activations", "nvme", "--resident", "0", "--streamed", "0")
    code, out, err = run(capsys, "plan", *FITS, *argv, "--nvme-dir", str(a), "--nvme-dir", str(b))
    assert code == 0, err
    files = [line.split() for line in out.splitlines() if ".bin " in line]
    assert [f[0] for f in files] == [str(a / "nvme0.bin"), str(b / "nvme1.bin")]
    nvme_total = next(line.split()[1] for line in out.splitlines() if line.startswith("NVME"))
    assert abs(sum(float(f[1]) for f in files) - float(nvme_total)) <= 0.02
    assert "no GPUDirect Storage" in out


def test_ram_gb_is_read_and_printed_in_gib(capsys):
    """--ram-gb 64 is 64 GiB, printed as such, and the --ram-gb an infeasible plan suggests
    makes it fit (it was a GB figure typed into a GiB flag, and forgot the host margin)."""
    assert main(["plan", "--ram-gb", "64"]) == 1
    out = capsys.readouterr().out
    assert "usable = 64.0 GiB RAM less 5%" in out
    suggested = re.search(r"more host RAM: at least (\d+) GiB \(--ram-gb (\d+)\)", out)
    assert suggested and suggested[1] == suggested[2]
    assert main(["plan", "--ram-gb", suggested[2]]) == 0
    assert "usable = " + f"{float(suggested[2]):.1f} GiB" in capsys.readouterr().out


def test_machines_list_memory_in_gib(capsys):
    """The catalog's 24 GB RTX 4090 is 24 GiB (nvidia-smi's unit), not 26 decimal GB."""
    assert main(["machines"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[2] == "GiB" and "RAM GiB" in header
    pc = next(r.split() for r in rows if r.startswith("paper-pc-4090"))
    assert pc[2] == "24" and pc[4] == "250"


def test_plan_and_simulate_print_the_host_figure_in_gib(capsys):
    """One host figure: the plan's CPU line and simulate's peak are the same GiB figure."""
    argv = ["--model", "llama-3.2-1b", "--machine", "paper-pc-4090", "--batch", "2", "--seq", "256"]
    assert main(["plan", *argv]) == 0
    cpu = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU"))
    assert main(["simulate", *argv]) == 0
    peak = next(line for line in capsys.readouterr().out.splitlines() if "peak memory" in line)
    planned = cpu.split()[1]
    assert cpu.split()[2] == "GiB" and f"cpu {planned} GiB" in peak


def test_the_plan_shows_bytes_per_parameter_per_tier(capsys):
    """Each tier's ledger peak over the model's parameters, in the text and in the JSON."""
    argv = ["plan", "--model", "qwen2.5-14b", "--machine", "h200-16c-128g", "--batch", "16"]
    code, out, _ = run(capsys, *argv)
    code_json, text, _ = run(capsys, *argv, "--json")
    assert code == code_json == 0
    summary = json.loads(text)
    params = summary["model"]["params"]
    for tier, memory in summary["memory"].items():
        per_param = memory["peak_bytes"] / params
        assert memory["bytes_per_param"] == pytest.approx(per_param, abs=1e-3)
        line = next(x for x in out.splitlines() if x.startswith(tier.upper()))
        assert line.endswith(f"({per_param:.1f} B/param)"), line


def test_under_global_clipping_the_plan_says_what_its_candidates_were_timed_with(capsys):
    """The search's step is not the plan's when updates speculate: the line says which count
    the candidates were timed with (none without global clipping)."""
    argv = ("plan", "--model", "llama-3.1-8b", "--machine", "paper-pc-4090")
    told = {}
    cases = (("--batch", "16"), ("--batch", "8"), ("--batch", "8", "--speculate", "3", "--held-grads", "ram"),
             ("--batch", "8", "--clip", "per-unit"))  # fmt: skip
    for extra in cases:
        code, out, _ = run(capsys, *argv, *extra)
        assert code == 0
        told[extra] = [line for line in out.splitlines() if "candidates timed with" in line]
    # batch 16: the plan of the search with every host update speculating wins; batch 8: the
    # one with every update waiting (at the planner's one-in-two prior of rolled-back steps)
    assert "every host update speculating" in told[cases[0]][0]
    assert "every update waiting for the norm" in told[cases[1]][0]
    assert "the first 3 host updates speculating" in told[cases[2]][0]
    assert told[cases[3]] == []


@pytest.mark.parametrize(("schedule", "home"), [("gpu-only", "gpu"), ("zero-offload", "cpu")])
def test_the_header_says_where_the_optimizer_state_is(capsys, schedule, home):
    code, out, _ = run(capsys, "plan", "--model", "llama-3.2-1b", "--machine", "h200-16c-128g",
                       "--schedule", schedule)  # fmt: skip
    assert code == 0 and f"optimizer on {home}" in out.splitlines()[1]
