"""Training and rollout on one pool of GPUs (co-located) or on two (split): memory, switch and
weight-sync costs, and the RL step of each, with a search over both.

A step is one rollout round (`rollout_time`), one training step on its sequences (`estimate`
of the training layout, global batch = prompts x samples sequences of prompt + response
tokens), the weight sync from trainer to engines and, co-located, the switch between them.

Co-located (slime's `--colocate`): the N GPUs run both. While the engines generate, the trainer's
state on the GPU (weights, gradients, master, moments: the layout ledger's model-state terms) is
offloaded to pinned host memory and its activations are freed; while it trains, the engines
release their weights and KV. Each process keeps its CUDA context, so per GPU

    train phase   = M_train + rollout_context
    rollout phase = M_rollout + train_context
    sync phase    = train weights + engine weights + both contexts + sync_bucket
    peak          = max of the three

(M_train: `build_layout_ledger`; M_rollout: `build_engine_ledger`; sync_bucket: the trainer's
weights are pushed in buckets of `SYNC_BUCKET` bytes, slime's `--update-weight-buffer-size`
default of 512 MiB). The host must hold the offloaded state of every GPU of a node beside the
trainer's own host bytes (CPU Adam). Per step the switch moves the offloaded state down and back
up over each GPU's PCIe link (pinned rates), state / d2h + state / h2d, and the sync moves each GPU's engine weights
over NVLink when the engine and the trainer's TP x PP x EP group both fit one node, else at the
network rate: engine weights / bw.

Split: N_t training GPUs, N_r = N - N_t rollout GPUs, each side its own ledger; no switch. The
sync sends the full BF16 model to every engine over the network: max(engine weights per GPU /
network, engines x model bytes / (N_t x network)), the receivers' or the senders' side. The step
is rollout + train + sync; `overlapped_s` = max(rollout, train) + sync is the one-step
off-policy (asynchronous) variant split pools allow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slide_ir.layouts.cluster import Cluster
from slide_ir.layouts.ledger import LayoutLedger, build_layout_ledger
from slide_ir.layouts.plan import Layout, group_on_nvlink, layout_problems
from slide_ir.layouts.rollout import (
    Engine,
    EngineLedger,
    RolloutWork,
    build_engine_ledger,
    engine_problems,
    weight_bytes,
)
from slide_ir.layouts.rollout_cost import RolloutTime, rollout_time
from slide_ir.layouts.search import estimate, search
from slide_ir.layouts.work import BF16
from slide_ir.specs.model import ModelSpec

SYNC_BUCKET = 512 * 2**20  # slime --update-weight-buffer-size default (bytes)
_STATE = ("weights", "gradients", "master", "moments")


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolPlan:
    mode: str  # "colocated" or "split"
    layout: Layout  # the training layout (its `gpus`: N co-located, N_t split)
    engine: Engine
    rollout_gpus: int
    train: LayoutLedger
    rollout: EngineLedger
    phases: tuple[tuple[str, int], ...]  # GPU bytes per phase (co-located), or per pool (split)
    resident: tuple[tuple[str, int], ...]  # the named terms added to the two ledgers
    host_per_node: int
    times: RolloutTime
    train_s: float
    switch_s: float
    sync_s: float

    @property
    def peak_bytes(self) -> int:
        return max(b for _, b in self.phases)

    @property
    def fits(self) -> bool:
        cap = self.train.gpu_capacity
        return (self.peak_bytes <= cap and self.rollout.fits
                and self.host_per_node <= self.train.host_capacity)  # fmt: skip

    @property
    def step_s(self) -> float:
        return self.times.round_s + self.train_s + self.switch_s + self.sync_s

    @property
    def overlapped_s(self) -> float:
        """Split pools, one step off-policy: rollout and training at once (co-located pools
        cannot overlap them: their step)."""
        if self.mode == "colocated":
            return self.step_s
        return max(self.times.round_s, self.train_s) + self.switch_s + self.sync_s


def training_layout(base: Layout, work: RolloutWork, gpus: int) -> Layout:
    """`base` on `gpus` GPUs, training the round's sequences at prompt + response tokens."""
    dp = base.dp if base.dp and base.gpus == gpus else 0
    return replace(base, gpus=gpus, dp=dp, seq=work.context, global_batch=work.sequences)


def _state_bytes(led: LayoutLedger) -> int:
    return sum(led.term(k) for k in _STATE)


def _sync_bandwidth(lay: Layout, eng: Engine, cluster: Cluster) -> float:
    node = cluster.gpus_per_node
    model_group = max(lay.tp * lay.pp, lay.ep)
    local = group_on_nvlink(1, eng.gpus, node) and group_on_nvlink(1, model_group, node)
    return cluster.nvlink_bytes_per_s if local else cluster.network_bytes_per_s


def colocated(
    spec: ModelSpec, lay: Layout, eng: Engine, work: RolloutWork, cluster: Cluster
) -> PoolPlan:
    """Training layout `lay` (its `gpus` = N) and N / G engines on the same N GPUs."""
    n = lay.gpus
    train = build_layout_ledger(spec, lay, cluster)
    roll = build_engine_ledger(spec, eng, work, cluster, n // eng.gpus)
    resident = (("train_context", train.term("reserve")), ("rollout_context", roll.term("context")),
                ("sync_bucket", SYNC_BUCKET))  # fmt: skip
    r = dict(resident)
    sync_phase = train.term("weights") + roll.term("weights") + sum(r.values())
    phases = (("train", train.gpu_bytes + r["rollout_context"]),
              ("rollout", roll.gpu_bytes + r["train_context"]), ("sync", sync_phase))  # fmt: skip
    state, link = _state_bytes(train), cluster.machine.link
    return PoolPlan(
        mode="colocated", layout=lay, engine=eng, rollout_gpus=n, train=train, rollout=roll,
        phases=phases, resident=resident,
        host_per_node=train.host_per_node + state * cluster.gpus_per_node,
        times=rollout_time(spec, eng, work, cluster, n // eng.gpus, roll),
        train_s=estimate(spec, lay, cluster).step_s,
        switch_s=state / link.d2h_bytes_per_s + state / link.h2d_bytes_per_s,
        sync_s=roll.term("weights") / _sync_bandwidth(lay, eng, cluster),
    )  # fmt: skip


def split(
    spec: ModelSpec, lay: Layout, eng: Engine, work: RolloutWork, cluster: Cluster,
    rollout_gpus: int,
) -> PoolPlan:  # fmt: skip
    """Training layout `lay` on its own `lay.gpus` GPUs, engines on `rollout_gpus` others."""
    train = build_layout_ledger(spec, lay, cluster)
    engines = rollout_gpus // eng.gpus
    roll = build_engine_ledger(spec, eng, work, cluster, engines)
    net = cluster.network_bytes_per_s
    model = BF16 * spec.total_params
    sync = max(weight_bytes(spec, eng) / net, engines * model / (lay.gpus * net))
    return PoolPlan(
        mode="split", layout=lay, engine=eng, rollout_gpus=rollout_gpus, train=train,
        rollout=roll, phases=(("train", train.gpu_bytes), ("rollout", roll.gpu_bytes)),
        resident=(), host_per_node=train.host_per_node,
        times=rollout_time(spec, eng, work, cluster, engines, roll),
        train_s=estimate(spec, lay, cluster).step_s, switch_s=0.0, sync_s=sync,
    )  # fmt: skip


def engines_for(spec: ModelSpec, pool: int, cluster: Cluster, kv_dtype: str) -> list[Engine]:
    """Every valid engine on a pool of `pool` GPUs: G dividing it, TP dividing G and a node,
    EP dividing G (MoE: the experts too)."""
    node, out = cluster.gpus_per_node, []
    for g in (d for d in range(1, pool + 1) if pool % d == 0):
        for tp in (t for t in range(1, min(g, node) + 1) if g % t == 0):
            for ep in (e for e in range(1, g + 1) if g % e == 0) if spec.is_moe else (1,):
                eng = Engine(gpus=g, tp=tp, ep=ep, kv_dtype=kv_dtype)
                if not engine_problems(spec, eng, pool, node):
                    out.append(eng)
    return out


def _best_engine(
    spec: ModelSpec, work: RolloutWork, cluster: Cluster, pool: int, kv_dtype: str
) -> Engine | None:
    """The engine with the shortest round on `pool` GPUs among those that fit."""
    best: tuple[float, Engine] | None = None
    for eng in engines_for(spec, pool, cluster, kv_dtype):
        led = build_engine_ledger(spec, eng, work, cluster, pool // eng.gpus)
        if led.fits:
            t = rollout_time(spec, eng, work, cluster, pool // eng.gpus, led).round_s
            best = min(best, (t, eng), key=lambda r: r[0]) if best else (t, eng)
    return best[1] if best else None


def search_pools(
    spec: ModelSpec, base: Layout, work: RolloutWork, cluster: Cluster, gpus: int, *,
    kv_dtype: str = "bf16", top: int = 8, layouts: int = 3,
) -> list[PoolPlan]:  # fmt: skip
    """Co-located and split plans for `gpus` GPUs that fit, fastest step first. Co-located:
    the `layouts` fastest training layouts on N that fit, each with every valid engine. Split:
    whole nodes (or halves of one node) for the engines, the fastest training layout and the
    fastest engine on each side."""
    plans: list[PoolPlan] = []
    for lay, _ in search(spec, training_layout(base, work, gpus), cluster, top=layouts):
        for eng in engines_for(spec, gpus, cluster, kv_dtype):
            plan = colocated(spec, lay, eng, work, cluster)
            if plan.fits:
                plans.append(plan)
    step = cluster.gpus_per_node if gpus > cluster.gpus_per_node else max(gpus // 2, 1)
    for roll in range(step, gpus, step):
        ranked = search(spec, training_layout(base, work, gpus - roll), cluster, top=1)
        best = _best_engine(spec, work, cluster, roll, kv_dtype)
        if ranked and best is not None:
            plan = split(spec, ranked[0][0], best, work, cluster, roll)
            if plan.fits:
                plans.append(plan)
    plans.sort(key=lambda p: p.step_s)
    return plans[:top]


def check_training(spec: ModelSpec, lay: Layout, cluster: Cluster) -> None:
    """Raise ValueError naming the first layout rule the training side breaks."""
    for problem in layout_problems(spec, lay, cluster.gpus_per_node):
        raise ValueError(f"training layout: {problem}")
