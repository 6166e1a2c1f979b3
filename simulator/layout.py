"""Simulate a layout's step: build the 1F1B graph, run it in the engine with `LayoutCosts`,
and read step time, tokens/s, MFU, bubble and communication share per dimension off the trace.

The trace is an ordinary `Trace` (lanes gpu{s}, net{k}, ...), so the Gantt and Chrome-trace
exporters work on it as on any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.engine import simulate
from slide_ir.ir.graph import Graph, lane_kind
from slide_ir.ir.trace import Trace
from slide_ir.layouts.cluster import Cluster
from slide_ir.layouts.cost import LayoutCosts, lane_dim
from slide_ir.layouts.graph import layout_graph
from slide_ir.layouts.plan import Layout, bubble
from slide_ir.layouts.work import all_stages
from slide_ir.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutRun:
    graph: Graph
    trace: Trace
    step_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    bubble: float  # (p - 1) / (v m + p - 1)
    gpu_idle: float  # idle share of the GPU lanes (mean over stages) in the simulated step
    comm_share: dict[str, float]  # busiest stage's busy time per dimension / step time

    def summary(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "bubble": self.bubble,
            "gpu_idle": self.gpu_idle,
            "comm_share": dict(self.comm_share),
            "ops": len(self.graph.ops),
        }


def simulate_layout(spec: ModelSpec, lay: Layout, cluster: Cluster) -> LayoutRun:
    graph = layout_graph(spec, lay, cluster.name)
    costs = LayoutCosts(cluster, lay, experts_per_token=spec.experts_per_token or 1,
                        works=all_stages(spec, lay))  # fmt: skip
    trace = simulate(graph, costs, meta={"layout": lay.describe(), "cluster": cluster.name})
    step = max(s.end for s in trace.spans)
    busy: dict[str, float] = {}
    for span in trace.spans:
        busy[span.lane] = busy.get(span.lane, 0.0) + span.end - span.start
    gpu = [v for lane, v in busy.items() if lane_kind(lane) == "gpu"]
    share: dict[str, float] = {}
    for lane, v in busy.items():
        if lane_kind(lane) == "net":
            dim = lane_dim(lane)[1]
            share[dim] = max(share.get(dim, 0.0), v / step)
    flops = graph.info.flops_per_step
    peak = cluster.machine.gpu.bf16_peak_tflops * 1e12
    tokens = lay.batch * lay.seq
    return LayoutRun(
        graph=graph,
        trace=trace,
        step_s=step,
        tokens_per_s=tokens / step,
        tokens_per_s_per_gpu=tokens / step / lay.gpus,
        tflops_per_gpu=flops / step / lay.gpus / 1e12,
        mfu=flops / (step * lay.gpus * peak),
        bubble=bubble(lay.pp, lay.m, lay.virtual_stages),
        gpu_idle=1.0 - sum(gpu) / len(gpu) / step,
        comm_share=share,
    )
