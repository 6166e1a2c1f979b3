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

Latency terms are not modelled beyond `Efficiency.launch_s` per op.
"""

from __future__ import annotations

from slide_ir.cost import CostModel, Efficiency
from slide_ir.graph import Op, OpKind
from slide_ir.layout import Layout, group_on_nvlink, strides
from slide_ir.layout_cluster import Cluster

DIMS = ("tp", "cp", "ep", "pp", "dp", "edp")
COLLECTIVES = frozenset(
    {OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER, OpKind.ALL_TO_ALL,
     OpKind.SEND_RECV}
)  # fmt: skip


def net_lane(stage: int, dim: str) -> str:
    return f"net{len(DIMS) * stage + DIMS.index(dim)}"


def lane_dim(lane: str) -> tuple[int, str]:
    """(stage, dimension) of a `net` lane."""
    index = int(lane[len("net") :])
    return index // len(DIMS), DIMS[index % len(DIMS)]


class LayoutCosts:
    """(op) -> seconds for a layout graph on `cluster`."""

    __slots__ = ("base", "cluster", "dedup", "groups", "host_rate", "topk")

    def __init__(
        self,
        cluster: Cluster,
        layout: Layout,
        *,
        experts_per_token: int = 1,
        efficiency: Efficiency | None = None,
    ) -> None:
        self.cluster = cluster
        self.topk, self.dedup = experts_per_token, layout.deepep
        self.base = CostModel(cluster.machine, efficiency=efficiency)
        self.host_rate = cluster.host_adam_elems_per_s() / cluster.gpus_per_node
        st = strides(layout)
        self.groups = {
            "tp": (layout.tp, st["tp"]),
            "cp": (layout.cp, st["cp"]),
            "ep": (layout.ep, st["ep"]),
            "pp": (2, st["pp"]),  # a hop between neighbouring stages
            "dp": (layout.data_parallel * layout.cp, st["cp"]),
            "edp": (layout.expert_dp, layout.ep),
        }

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
        return self.base.seconds(op)

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
