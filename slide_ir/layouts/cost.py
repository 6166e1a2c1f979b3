"""LayoutCosts: seconds of a layout graph's ops, collectives priced from message sizes and links.

Lanes of stage s (0-based): `gpu{s}`, `h2d{s}`, `d2h{s}`, `cpu{s}` and six `net` lanes,
`net{6s + d}` with d = 0 TP, 1 CP, 2 EP, 3 PP, 4 DP (non-expert gradients and weights, group
DP x CP), 5 expert DP (group N / (EP x PP)). Compute and PCIe copies are priced by the
single-GPU `CostModel` of the node's GPU; the host update by the node's CPU Adam rate shared by
its GPUs. A collective of B bytes (the full logical message) over a group of g ranks, at the
per-GPU, per-direction bandwidth bw of its link (NVLink when the group fits one node, else the
network), ring algorithms:

    all-reduce      2 (g - 1) / g x B / bw
    reduce-scatter  (g - 1) / g x B / bw       all-gather: the same
    all-to-all      max(B x (g_in - 1) / g / nvlink, B x (g - g_in) / g / network),
                    g_in = ranks of the group inside one node
    send/recv       B / bw                     (CP ring: B is every round's bytes together)

EP dispatch with node deduplication (`Layout.deepep`, DeepEP's internode kernels, as DeepSeek-V3
describes): a token routed to k experts over n = g / g_in nodes crosses to each remote node it
needs once and fans out there over NVLink. With balanced routing it needs
(n - 1)(1 - (1 - 1/n)^k) remote nodes, so the network carries B / k x that instead of
B (g - g_in) / g, and NVLink also carries the fan-out of what arrives.

Attention kernels run faster on longer blocks (fewer, fuller tiles; less of the causal diagonal):
FlashAttention-3 on an H100 SXM5, BF16, head dim 128, causal, forward (Shah et al. 2024,
arXiv 2407.08608, Figure 5) reaches 292, 423, 521, 579, 602, 616 TFLOP/s at 512, 1K, 2K, 4K,
8K, 16K tokens. Ring attention (CP) runs its kernels on each rank's seq / CP tokens, TP only
splits heads, so the attention rate is scaled by `attention_efficiency(seq / CP)` over the same
curve at the length the GPU's rate stands for (`Cluster.attention_ref_seq`: 16K, the plateau,
for the catalog's rule; the length a calibration measured at, for a measured rate). The curve's
shape is used for both passes and for DeepSeek sparse attention too (an assumption: the paper
gives no causal backward curve, nor one for sparse kernels).

Weight GEMMs at few rows (`gemm_excess`): a GEMM runs at the matmul rate only while it is not
bound by HBM. Roofline per GEMM of (M x K) @ (K x N): max(2 M K N / matmul rate, bytes / HBM
bandwidth), bytes 2 (M K + K N + M N) in BF16 for the forward and for the input gradient (both
read the weight once), and for the weight gradient 2 (M K + M N) + 8 K N: Megatron accumulates
it into the FP32 main gradient in the GEMM (`--gradient-accumulation-fusion`, on by default,
TE's `fuse_wgrad_accumulation`; BF16 training accumulates gradients in FP32,
megatron/training/arguments.py), which reads and writes 4 B per weight per micro-batch. So the
weight gradient is memory-bound below M = 4 x (matmul rate / HBM bandwidth), about 950 rows at
the H100's catalog rates (792 TFLOP/s, 3.35 TB/s), near 1,100 with the activations' bytes of an
expert's fc1 (4096 x 3072): routed experts at 512 tokens each are. The time above the
compute-bound figure is added to the pass; at thousands of rows (dense layers, experts with many
tokens) it is zero. HBM at the datasheet rate: an optimistic bound, so the term is a lower one.

Latency terms are not modelled beyond `Efficiency.launch_s` per op.
"""

from __future__ import annotations

import itertools
import math

from slide_ir.ir.graph import Op, OpKind, Work
from slide_ir.layouts.cluster import Cluster
from slide_ir.layouts.plan import Layout, group_on_nvlink, strides
from slide_ir.layouts.work import Gemm, StageWork
from slide_ir.planning.cost import CostModel
from slide_ir.planning.machine_rates import Efficiency

DIMS = ("tp", "cp", "ep", "pp", "dp", "edp")
COLLECTIVES = frozenset(
    {OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER, OpKind.ALL_TO_ALL,
     OpKind.SEND_RECV}
)  # fmt: skip


# (tokens, TFLOP/s): FA3 forward, causal, head dim 128, H100 SXM5 BF16 (arXiv 2407.08608 Fig. 5)
FA3_CAUSAL_CURVE = ((512, 292.0), (1024, 423.0), (2048, 521.0), (4096, 579.0), (8192, 602.0),
                    (16384, 616.0))  # fmt: skip
_COMPUTE = frozenset({OpKind.FWD, OpKind.BWD, OpKind.RECOMPUTE})


def attention_efficiency(tokens: int) -> float:
    """Attention rate at `tokens` per kernel over the rate on long sequences (0..1]: the FA3
    curve, log-linear between its points, flat beyond its ends."""
    pts = FA3_CAUSAL_CURVE
    if tokens <= pts[0][0]:
        return pts[0][1] / pts[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if tokens <= x1:
            t = math.log(tokens / x0) / math.log(x1 / x0)
            return (y0 + t * (y1 - y0)) / pts[-1][1]
    return 1.0


def net_lane(stage: int, dim: str) -> str:
    return f"net{len(DIMS) * stage + DIMS.index(dim)}"


def lane_dim(lane: str) -> tuple[int, str]:
    """(stage, dimension) of a `net` lane."""
    index = int(lane[len("net") :])
    return index // len(DIMS), DIMS[index % len(DIMS)]


class LayoutCosts:
    """(op) -> seconds for a layout graph on `cluster`."""

    __slots__ = ("attn_slowdown", "base", "cluster", "dedup", "excess", "groups", "host_rate",
                 "selective", "topk", "v")  # fmt: skip

    def __init__(
        self,
        cluster: Cluster,
        layout: Layout,
        *,
        experts_per_token: int = 1,
        efficiency: Efficiency | None = None,
        works: tuple[StageWork, ...] | list[StageWork] = (),
    ) -> None:
        """`works`: the stages' `StageWork`, for the GEMM roofline (`gemm_excess`); without them
        compute ops are priced at the matmul rate alone."""
        self.cluster = cluster
        self.topk, self.dedup = experts_per_token, layout.deepep
        self.base = CostModel(cluster.machine, efficiency=efficiency)
        self.host_rate = cluster.host_adam_elems_per_s() / cluster.gpus_per_node
        local = layout.seq // layout.cp  # tokens each attention kernel runs over
        ref = attention_efficiency(cluster.attention_ref_seq)
        self.attn_slowdown = ref / attention_efficiency(local) - 1.0  # extra time per rated s
        st = strides(layout)
        self.groups = {
            "tp": (layout.tp, st["tp"]),
            "cp": (layout.cp, st["cp"]),
            "ep": (layout.ep, st["ep"]),
            "pp": (2, st["pp"]),  # a hop between neighbouring stages
            "dp": (layout.data_parallel * layout.cp, st["cp"]),
            "edp": (layout.expert_dp, layout.ep),
        }
        self.v, self.selective = layout.virtual_stages, "moe" in layout.recompute_modules
        self.excess = {w.stage: self._excess(w.gemms) for w in works}

    def gemm_roofline(self, g: Gemm) -> tuple[float, float, float]:
        """Seconds one GEMM of `g` spends above the compute-bound time in the forward, the input
        gradient and the weight gradient (see the module docstring): max(0, bytes / HBM - FLOPs /
        matmul rate) each."""
        r = self.base.rates
        compute = 2.0 * g.m * g.k * g.n / r.flops
        acts = 2.0 * g.m * (g.k + g.n)
        fwd = max(0.0, (acts + 2.0 * g.k * g.n) / r.hbm - compute)
        wgrad = max(0.0, (acts + 8.0 * g.k * g.n) / r.hbm - compute)
        return fwd, fwd, wgrad

    def _excess(self, gemms: tuple[Gemm, ...]) -> dict[OpKind, float]:
        """Extra seconds per micro-batch of the stage's whole forward, backward, recompute."""
        fwd = bwd = moe_fwd = 0.0
        for g in gemms:
            f, dgrad, wgrad = self.gemm_roofline(g)
            fwd, bwd = fwd + g.count * f, bwd + g.count * (dgrad + wgrad)
            moe_fwd += g.count * f if g.moe else 0.0
        return {OpKind.FWD: fwd, OpKind.BWD: bwd,
                OpKind.RECOMPUTE: moe_fwd if self.selective else fwd}  # fmt: skip

    def gemm_excess(self, stage: int, kind: OpKind) -> float:
        """Extra seconds of the GEMM roofline in one micro-batch's `kind` pass (FWD, BWD,
        RECOMPUTE) on `stage`, all its chunks together; 0 without the stage's work."""
        return self.excess.get(stage, {}).get(kind, 0.0)

    def bandwidth(self, dim: str) -> float:
        size, stride = self.groups[dim]
        on_nvlink = group_on_nvlink(stride, size, self.cluster.gpus_per_node)
        return self.cluster.nvlink_bytes_per_s if on_nvlink else self.cluster.network_bytes_per_s

    def seconds(self, op: Op) -> float:
        launch = self.base.efficiency.launch_s
        if op.kind in COLLECTIVES:
            return launch + self.collective_seconds(op.kind, lane_dim(op.lane)[1], op.work.bytes)
        if op.kind == OpKind.ADAM:
            return launch + op.work.elements / self.host_rate
        if op.kind in _COMPUTE:
            return (
                launch + self.compute_seconds(op.work) + self.gemm_excess(op.unit, op.kind) / self.v
            )
        return self.base.seconds(op)

    def compute_seconds(self, work: Work) -> float:
        """GPU compute of `work`, its attention at this layout's kernel length."""
        extra = work.attn_flops / self.base.rates.attention * self.attn_slowdown
        return self.base.compute_seconds(work) + extra

    def collective_seconds(self, kind: OpKind, dim: str, message: int) -> float:
        g = self.groups[dim][0]
        if message == 0 or g == 1:
            return 0.0
        bw = self.bandwidth(dim)
        if kind == OpKind.ALL_REDUCE:
            return 2 * (g - 1) / g * message / bw
        if kind in (OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER):
            return (g - 1) / g * message / bw
        if kind == OpKind.ALL_TO_ALL:
            return self._all_to_all(g, message)
        return message / bw

    def _all_to_all(self, g: int, message: int) -> float:
        inside = min(g, self.cluster.gpus_per_node)
        local, remote = message * (inside - 1) / g, message * (g - inside) / g
        if self.dedup and g > inside:
            nodes, k = -(-g // inside), self.topk
            fan_out = remote * (inside - 1) / inside  # arrivals forwarded to their GPUs
            local, remote = local + fan_out, message / k * (nodes - 1) * (1 - (1 - 1 / nodes) ** k)
        intra = local / self.cluster.nvlink_bytes_per_s
        return max(intra, remote / self.cluster.network_bytes_per_s)
