"""Property tests: whatever the argument values or however a checkpoint is damaged, `slide`
exits 0, 1 or 2 with at most one line of its own on stderr, never a traceback."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from slide.cli import main

TRAIN = ["train", "--device", "cpu", "--seq", "16", "--batch", "2", "--lr", "1e-3",
         "--no-progress"]  # fmt: skip
TRAIN_ONLY = {"--save-every", "--keep", "--lr", "--betas", "--eps", "--warmup-steps"}
FUZZ = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory, tokens):
    out = tmp_path_factory.mktemp("good") / "run"
    assert main([*TRAIN, "--data", tokens, "--steps", "1", "--out", str(out)]) == 0
    return out


def own_lines(err: str) -> list[str]:
    """stderr lines that are Slide's verdict (logging warnings are allowed beside it)."""
    return [line for line in err.splitlines() if line.strip() and not line.startswith("WARNING")]


def assert_clean_exit(code: int, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err, err
    assert len(own_lines(err)) <= 1, err


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage and one error line, exit 2
        code = int(exc.code or 0)
        err = capsys.readouterr().err
        assert code == 2 and err.splitlines()[-1].startswith("slide"), err
        return code, ""
    return code, capsys.readouterr().err


numbers = st.one_of(
    st.integers(-3, 3).map(str),
    st.sampled_from(["0", "-1", "1e9", "nan", "inf", "abc", "", "2.5", "0x10"]),
)
flags = st.sampled_from(
    ["--steps", "--batch", "--seq", "--save-every", "--keep", "--lr", "--grad-accum", "--betas",
     "--eps", "--cache-units", "--resident", "--streamed", "--keep-activations", "--clip-norm",
     "--warmup-steps"]
)  # fmt: skip


@FUZZ
@given(pairs=st.lists(st.tuples(flags, numbers), min_size=1, max_size=3))
def test_train_argument_values(capsys, tmp_path, tokens, pairs):
    argv = [*TRAIN, "--data", tokens, "--steps", "1"]
    for flag, value in pairs:
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    code, err = run_cli(capsys, [*argv, "--out", str(tmp_path / f"o{abs(hash(tuple(pairs)))}")])
    assert_clean_exit(code, err)


@FUZZ
@given(
    command=st.sampled_from(["plan", "simulate", "critical-batch"]),
    model=st.sampled_from(["llama-3.1-8b", "tiny-llama", "nope", "", "/nonexistent/config.json"]),
    machine=st.sampled_from(["paper-pc-4090", "h200-16c-128g", "nope", "x.toml"]),
    pairs=st.lists(st.tuples(flags.filter(lambda f: f not in TRAIN_ONLY), numbers), max_size=2),
)
def test_planning_argument_values(capsys, command, model, machine, pairs):
    argv = [command, "--model", model, "--machine", machine]
    for flag, value in pairs:
        argv.append(f"{flag}={value}")
    if command != "plan":
        argv = [a for a in argv if not a.startswith("--steps")]
    code, err = run_cli(capsys, argv)
    assert_clean_exit(code, err)


# draws never depend on a file's content (hypothesis replays them): positions are fractions,
# choices are indices taken modulo the number of candidates
fraction = st.floats(0.0, 1.0, exclude_max=True)
index = st.integers(0, 10_000)


def _pick(keys: list[str], data: st.DataObject) -> str:
    return sorted(keys)[data.draw(index) % len(keys)]


def _truncate(path: Path, data: st.DataObject) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * data.draw(fraction))])


def _garbage(path: Path, data: st.DataObject) -> None:
    path.write_bytes(data.draw(st.binary(max_size=64)))


def _garbage_json(path: Path, data: st.DataObject) -> None:
    value = data.draw(st.sampled_from(["{}", "[]", "null", '"x"', "{", '{"steps_done": "3"}']))
    path.write_text(value)


def _drop_key(path: Path, data: st.DataObject) -> None:
    if path.suffix == ".json":
        state = json.loads(path.read_text())
        state.pop(_pick(list(state), data))
        path.write_text(json.dumps(state))
        return
    tensors = load_file(str(path))
    tensors.pop(_pick(list(tensors), data))
    save_file(tensors, str(path))


def _wrong_dtype(path: Path, data: st.DataObject) -> None:
    if path.suffix == ".json":
        return _garbage_json(path, data)
    tensors = load_file(str(path))
    name = _pick(list(tensors), data)
    tensors[name] = tensors[name].to(data.draw(st.sampled_from([torch.int64, torch.uint8])))
    save_file(tensors, str(path))
    return None


def _flip_bytes(path: Path, data: st.DataObject) -> None:
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        raw[int(len(raw) * data.draw(fraction))] ^= 0xFF
    path.write_bytes(bytes(raw))


DAMAGE = [_truncate, _garbage, _garbage_json, _drop_key, _wrong_dtype, _flip_bytes]
FILES = ["model.safetensors", "optimizer.safetensors", "slide_state.json"]


@FUZZ
@given(data=st.data())
def test_damaged_checkpoints(capsys, tmp_path, tokens, good_run, data):
    run = Path(tempfile.mkdtemp(dir=tmp_path)) / "run"
    shutil.copytree(good_run, run)
    ckpt = run / "checkpoints" / "step-000001"
    file = ckpt / data.draw(st.sampled_from(FILES))
    data.draw(st.sampled_from(DAMAGE))(file, data)
    code, err = run_cli(capsys, [*TRAIN, "--data", tokens, "--steps", "2", "--resume", str(run),
                                 "--out", str(run)])  # fmt: skip
    assert_clean_exit(code, err)


def test_damage_is_named(capsys, tmp_path, tokens, good_run):
    """The three cases the issue names: truncated moments, `{}` as state, a missing file."""
    cases = {
        "optimizer.safetensors": lambda p: p.write_bytes(p.read_bytes()[:100]),
        "slide_state.json": lambda p: p.write_text("{}"),
        "model.safetensors": lambda p: p.unlink(),
    }
    for name, damage in cases.items():
        run = tmp_path / name
        shutil.copytree(good_run, run)
        damage(run / "checkpoints" / "step-000001" / name)
        code, err = run_cli(capsys, [*TRAIN, "--data", tokens, "--steps", "2", "--resume",
                                     str(run)])  # fmt: skip
        assert code == 2 and name in err and len(own_lines(err)) == 1, err
