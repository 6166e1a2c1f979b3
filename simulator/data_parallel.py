"""Simulate data-parallel sliding on one node: rank 0's graph, priced for N ranks on one host.

Every rank runs the same schedule on its slice of the global batch at the same time, so one
rank's timeline is the node's: rank 0 (the largest shard) is simulated, its collectives priced
by the ring formulas over the GPU-to-GPU link and its host work at 1/N of the host's rates
(`CostModel(nproc=N)`). Throughput is the global batch's: N times the rank's tokens per step.
N = 1 is `simulator.run.simulate_plan` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simulator.dram import simulate_shared_dram
from simulator.run import SimResult, resolve_machine, resolve_model
from slide_ir.ir.trace import Trace, trace_metrics
from slide_ir.planning.cost import CostModel
from slide_ir.planning.data_parallel import DataParallelPlan, plan_data_parallel
from slide_ir.planning.machine_rates import Efficiency
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

_GLOBAL = ("tokens_per_s", "compute_only_tokens_per_s")  # per rank in a rank's metrics


@dataclass(frozen=True, kw_only=True, slots=True)
class DataParallelResult:
    dp: DataParallelPlan
    rank: SimResult  # rank 0's plan (sharded graph), trace and metrics

    @property
    def feasible(self) -> bool:
        return self.dp.feasible

    @property
    def trace(self) -> Trace | None:
        return self.rank.trace

    def summary(self) -> dict[str, Any]:
        """`SimResult.summary`'s keys, for the node: the global batch and its tokens/s, memory
        per rank (GPU) and per host (RAM, NVMe); TFLOP/s stay per GPU. Plus `data_parallel`."""
        dp, n = self.dp, self.dp.nproc
        out = self.rank.summary()
        out["batch"] = dp.global_batch
        out["feasible"] = dp.feasible
        out["overflows"] = [{"tier": t, "bytes_over": int(b)} for t, b in dp.overflows()]
        out["ledger"] = {"gpu": dp.rank_bytes("gpu"), "cpu": dp.host_bytes("cpu"),
                         "nvme": dp.host_bytes("nvme")}  # fmt: skip
        for key in _GLOBAL:
            if key in out:
                out[key] *= n
        if "memory" in out:  # simulated peaks: the rank's GPU, the host's RAM and drives
            out["memory"] = {t: b * (1 if t == "gpu" else n) for t, b in out["memory"].items()}
        out["data_parallel"] = {**dp.summary(), "net_util": out.get("lane_util", {}).get("net")}
        return out


def simulate_data_parallel(
    model: str | ModelSpec,
    machine: str | Machine,
    config: TrainConfig,
    nproc: int,
    *,
    efficiency: Efficiency | None = None,
    force: bool = False,
) -> DataParallelResult:
    """Plan rank 0 of `nproc` (`config.batch` the global batch) and simulate it when the node's
    memory holds it (`force`: simulate anyway, for what-if timing)."""
    spec, mach = resolve_model(model), resolve_machine(machine)
    dp = plan_data_parallel(spec, mach, config, nproc)
    rank_plan = replace(dp.base, graph=dp.graph)
    if not dp.feasible and not force:
        return DataParallelResult(dp=dp, rank=SimResult(plan=rank_plan, trace=None, metrics=None))
    costs = CostModel(mach, cpu_threads=config.cpu_threads, efficiency=efficiency, nproc=nproc)
    trace = simulate_shared_dram(dp.graph, costs, meta={"cost_model": costs.describe()})
    metrics = trace_metrics(trace, dp.graph)
    return DataParallelResult(dp=dp, rank=SimResult(plan=rank_plan, trace=trace, metrics=metrics))
