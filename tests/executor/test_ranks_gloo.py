"""Data-parallel sliding on gloo, CPU mode: N ranks (real processes, started as torchrun
starts them) on a global batch give one process's losses and weights on it, within FP32
rounding (per-tensor relative error, see test_train_equivalence); each rank holds 1/N of the
optimizer state; a checkpoint taken on 2 ranks resumes exactly; a failing rank stops all."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from dp_rank import CASES, GLOBAL_BATCH, SEQ, STEPS, model_of, run_case
from hf_models import spec_of
from runs import LR, MACHINE, RTOL, build_run, max_rel_error, model_config

from executor.layout import unit_layouts
from executor.ranks import Ranks
from slide.session import default_optimizer_threads, optimizer_threads
from slide_ir import TrainConfig, load_machine
from slide_ir.ir.graph import PoolRole as R
from slide_ir.ir.graph import Tier
from slide_ir.ir.trace import Trace, trace_violations
from slide_ir.planning.data_parallel import shard_plan
from slide_ir.planning.planner import plan

RANK_SCRIPT = Path(__file__).with_name("dp_rank.py")
REPO = os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
THREE_RANK_CASES = ("sliding", "qwen2-tied-resident", "tied-resident-clip-accum", "tied-streamed",
                    "tied-resident-global-clip-accum")  # fmt: skip


@dataclass
class Launch:
    out: Path
    codes: list[int]
    stderr: list[str]

    def record(self, case: str, rank: int = 0) -> dict:
        return torch.load(self.out / f"{case}.rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: Path, nproc: int, cases: list[str], timeout: float = 300, **knobs: str) -> Launch:
    """`nproc` processes of dp_rank.py with the environment torchrun gives its workers (and
    `knobs`, executor.knobs' variables)."""
    out.mkdir(parents=True, exist_ok=True)
    port = str(_free_port())
    procs = []
    for rank in range(nproc):
        env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                            "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                            "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO, **knobs}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(out), *cases],
                                      env=env, stderr=subprocess.PIPE, text=True))  # fmt: skip
    errs = [p.communicate(timeout=timeout)[1] for p in procs]
    return Launch(out=out, codes=[p.returncode for p in procs], stderr=errs)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    run = launch(tmp_path_factory.mktemp("dp2"), 2, [*CASES, "resume"])
    assert run.codes == [0, 0], run.stderr[0][-3000:] + run.stderr[1][-3000:]
    return run


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    run = launch(tmp_path_factory.mktemp("dp3"), 3, list(THREE_RANK_CASES))
    assert run.codes == [0, 0, 0], "\n".join(e[-2000:] for e in run.stderr)
    return run


def _assert_equal_to_one_process(record: dict, case: str, tmp: Path) -> None:
    one = run_case(case, None, tmp)
    assert record["steps"] == STEPS
    for step, (ours, want) in enumerate(zip(record["losses"], one.losses, strict=True), 1):
        assert abs(ours - want) <= RTOL * abs(want), f"step {step}: loss {ours} vs {want}"
    ours, want = dict(record["state"]), dict(one.final_state)
    for name in [n for n in want if n.endswith("k_proj.bias")]:
        # zero gradient in exact arithmetic (softmax ignores a shift every key's score shares),
        # so each run moves it by rounding noise that Adam scales to steps of at most ~lr
        moved = float((ours.pop(name) - want.pop(name)).abs().max())
        assert moved <= 2 * LR * STEPS, f"{name}: {moved:.2e} apart"
    err, name = max_rel_error(ours, want)
    assert err <= RTOL, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_equal_one_process(two_ranks: Launch, case: str, tmp_path: Path) -> None:
    _assert_equal_to_one_process(two_ranks.record(case), case, tmp_path)
    assert two_ranks.record(case, rank=1)["state"] == {}  # rank 0 alone hands the state back


@pytest.mark.parametrize("case", THREE_RANK_CASES)
def test_three_ranks_equal_one_process(three_ranks: Launch, case: str, tmp_path: Path) -> None:
    _assert_equal_to_one_process(three_ranks.record(case), case, tmp_path)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_trace_obeys_its_sharded_graph(two_ranks: Launch, rank: int) -> None:
    case = "tied-resident-clip-accum"
    config = CASES[case][1]
    rank_config = TrainConfig(batch=GLOBAL_BATCH // 2, seq=SEQ, steps=STEPS, placement="small",
                              **config)  # fmt: skip
    base = plan(spec_of(model_of(case)), load_machine(MACHINE), rank_config)
    trace = Trace.from_json(two_ranks.record(case, rank)["trace"])
    assert {s.lane for s in trace.spans} >= {"gpu", "h2d", "d2h", "cpu", "net"}
    assert trace_violations(trace, shard_plan(base, 2, rank).graph) == []


def test_two_ranks_under_random_delays(tmp_path: Path) -> None:
    """Every lane sleeps a random 0-3 ms before each op: a collective missing a dependency (or
    a lane's order that the ranks do not share) shows up as a wrong result or a hang."""
    run = launch(tmp_path, 2, ["tied-resident-clip-accum"], timeout=120,
                 SLIDE_RANDOM_DELAY_MS="3", SLIDE_DELAY_SEED="11")  # fmt: skip
    assert run.codes == [0, 0], run.stderr[0][-3000:] + run.stderr[1][-3000:]
    _assert_equal_to_one_process(run.record("tied-resident-clip-accum"),
                                 "tied-resident-clip-accum", tmp_path)  # fmt: skip


def test_three_ranks_split_units_unevenly() -> None:
    """The 3-rank cases shard units whose sizes 3 does not divide (the last shard shorter)."""
    sizes = [lay.numel for lay in unit_layouts(spec_of(model_config(True))).values()]
    assert any(n % 3 for n in sizes), sizes


def test_a_resumed_two_rank_run_equals_an_uninterrupted_one(two_ranks: Launch) -> None:
    whole, resumed = two_ranks.record("sliding"), two_ranks.record("resume")
    assert resumed["losses"] == pytest.approx(whole["losses"][2:], rel=1e-6)
    err, name = max_rel_error(resumed["state"], whole["state"])
    assert err <= 1e-6, f"{name}: relative error {err:.2e}"


def test_a_failing_rank_stops_every_rank_naming_its_error(tmp_path: Path) -> None:
    run = launch(tmp_path, 2, ["fail"], timeout=120)
    assert run.codes[0] != 0 and run.codes[1] != 0
    assert "ValueError: boom at step 2" in run.stderr[1]
    assert "RankFailure: rank 1 failed: ValueError: boom at step 2" in run.stderr[0], run.stderr[0][
        -3000:
    ]


LEDGER_CASES = {
    "streamed-2": {"streamed": 2},
    "accum-2-resident-1": {"grad_accum": 2, "resident": 1},
}


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("case", sorted(LEDGER_CASES))
def test_each_rank_allocates_its_ledger_share(nproc: int, case: str, tmp_path: Path) -> None:
    """Every host pool a rank allocates equals its pool in the rank's sharded plan, byte for
    byte (BF16 compute, the ledger's unit), and the ranks' FP32 state adds up to one copy."""
    cfg = model_config(tied=True)
    config = TrainConfig(batch=GLOBAL_BATCH // nproc, seq=SEQ, steps=1, placement="small",
                         **LEDGER_CASES[case])  # fmt: skip
    p = plan(spec_of(cfg), load_machine("h200-16c-128g"), config)
    state = [pool.name for pool in p.graph.pools if pool.role in (R.MASTER, R.MOMENTS)]
    state_bytes = 0
    for rank in range(nproc):
        sharded = shard_plan(p, nproc, rank)
        run = build_run(p, cfg, tmp_path, torch.bfloat16, Ranks(rank=rank, nproc=nproc, groups={}))
        allocated = run.env.buffers.allocated
        host = [pool for pool in sharded.graph.pools
                if pool.tier in (Tier.CPU, Tier.PINNED) and pool.name in allocated]  # fmt: skip
        assert len(host) >= 6
        for pool in host:
            assert allocated[pool.name] == pool.bytes, (rank, pool.name)
        state_bytes += sum(allocated[name] for name in state)
        run.close()
    one = build_run(p, cfg, tmp_path, torch.bfloat16)
    assert state_bytes == sum(one.env.buffers.allocated[name] for name in state)
    one.close()


def test_ranks_on_one_host_share_its_optimizer_threads(monkeypatch) -> None:
    """16 cores: one process updates on 12 threads; N ranks 12 / N each (at least one), so the
    host runs what one process would; a pinned --cpu-threads stays as given."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert [default_optimizer_threads(n) for n in (1, 2, 4, 8, 16)] == [12, 6, 3, 1, 1]
    assert optimizer_threads(TrainConfig(batch=2, seq=8, steps=1, cpu_threads=5), 4) == 5
