"""The compute chain every schedule shares: forward, fused loss, checkpointed backward.

Units ("unit" in op ids): 0 embedding, 1..n decoder layers, n+1 head. Every schedule uses
sliding activation checkpointing: each decoder layer's input is saved (kept on the GPU, or copied
to pinned CPU memory, or on to NVMe), brought back ahead of the backward, and the layer recomputed.
Schedules differ in where weights come from and where gradients go; they plug in through the
`before_*` / `after_bwd` hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from slide_ir.builder import GraphBuilder
from slide_ir.config import TrainConfig
from slide_ir.graph import OpKind, Work
from slide_ir.ledger import BF16, FP32, adam_bytes_per_param, unit_params
from slide_ir.model import ModelSpec

K = OpKind


@dataclass(frozen=True, slots=True)
class StatePace:
    """Cost estimates the sliding schedule times streamed-state downloads by."""

    spill_s: float  # how long the next forward and loss leave the d2h lane free
    link_bytes_per_s: float  # one direction of the host link, both busy


@dataclass(kw_only=True)
class Ctx:
    """What an emitter needs, plus the facts that cross layer and step boundaries."""

    model: ModelSpec
    config: TrainConfig
    b: GraphBuilder
    drives: int
    resident: frozenset[int] = frozenset()
    streamed: frozenset[int] = frozenset()  # sliding units whose AdamW runs on the GPU
    kept: frozenset[int] = frozenset()  # units the forward leaves on the GPU for the backward
    last_update: dict[int, str] = field(default_factory=dict)  # unit -> its latest update op
    weights_ready: dict[int, str] = field(default_factory=dict)  # unit -> op that uploaded it
    unit_slot: dict[int, str] = field(default_factory=dict)  # unit -> GPU slot it occupies
    act_gpu: dict[int, str] = field(default_factory=dict)  # layer -> GPU slot of its input
    act_ready: dict[int, str] = field(default_factory=dict)  # layer -> op that put it there
    act_home: dict[int, str] = field(default_factory=dict)  # layer -> pinned/NVMe slot
    act_home_op: dict[int, str] = field(default_factory=dict)  # op that wrote the home copy
    workspace: str = ""  # slot recompute took, for its backward to release
    state_ready: dict[int, str] = field(default_factory=dict)  # streamed unit -> its state's d2h
    opt_slot: dict[int, str] = field(default_factory=dict)  # streamed unit -> GPU state slot
    opt_ready: dict[int, str] = field(default_factory=dict)  # streamed unit -> its state's h2d
    pace: StatePace = StatePace(spill_s=0.0, link_bytes_per_s=1.0)

    @property
    def n(self) -> int:
        return self.model.num_layers

    @property
    def hidden_bytes(self) -> int:
        return self.config.batch * self.config.seq * self.model.hidden_size * BF16

    def oid(self, step: int, micro: int, unit: int, what: str) -> str:
        m = f"m{micro}." if self.config.grad_accum > 1 else ""
        return f"s{step}.{m}L{unit}.{what}"

    def sid(self, step: int, unit: int, what: str) -> str:
        """Id of a once-per-step op (the update and its I/O)."""
        return f"s{step}.L{unit}.{what}"


Hook = Callable[[int], None]


def forward(ctx: Ctx, step: int, micro: int, before_layer: Hook) -> None:
    """Embedding, decoder layers 1..n, then the fused loss (LCE: forward and backward at once).
    `before_layer(u)` runs before unit u's compute is emitted (to issue prefetches)."""
    m, c, n, b = ctx.model, ctx.config, ctx.n, ctx.b
    bs = (c.batch, c.seq)

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    before_layer(0)
    (x1,) = b.emit(
        oid(0, "fwd"),
        K.FWD,
        "gpu",
        step=step,
        unit=0,
        work=Work(bytes=ctx.hidden_bytes),
        deps=[ctx.weights_ready.get(0)],
        acquire=["gpu_acts"],
    )
    ctx.act_gpu[1], ctx.act_ready[1] = x1, oid(0, "fwd")
    for i in range(1, n + 1):
        before_layer(i)
        done_with_unit = i not in ctx.kept and i in ctx.unit_slot
        (out,) = b.emit(
            oid(i, "fwd"),
            K.FWD,
            "gpu",
            step=step,
            unit=i,
            work=layer_work(m, c, backward=False),
            deps=[ctx.weights_ready.get(i)],
            acquire=["gpu_acts"],
            scratch=["gpu_workspace"],
            release=[ctx.unit_slot.pop(i) if done_with_unit else None],
        )
        ctx.act_gpu[i + 1], ctx.act_ready[i + 1] = out, oid(i, "fwd")
        if c.activations != "gpu":
            _save_activation(ctx, step, micro, i)
    before_layer(n + 1)
    b.emit(
        oid(n + 1, "loss"),
        K.LOSS,
        "gpu",
        step=step,
        unit=n + 1,
        work=Work(
            flops=m.head_fwd_flops(*bs) + m.head_bwd_flops(*bs),
            bytes=m.head_elementwise_bytes(*bs),
            elements=c.batch * c.seq * m.vocab_size,  # logits
        ),
        deps=[ctx.weights_ready.get(n + 1)],
        scratch=["gpu_workspace"],
        release=[ctx.act_gpu.pop(n + 1)],
    )


def backward(ctx: Ctx, step: int, micro: int, before_layer: Hook, after_bwd: Hook) -> None:
    """Layers n..1: (load input,) recompute, backward; then the embedding's backward.
    `before_layer(j)` issues prefetches; `after_bwd(u)` sends unit u's gradients on."""
    m, c, b = ctx.model, ctx.config, ctx.b

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    for j in range(ctx.n, 0, -1):
        before_layer(j)
        (ctx.workspace,) = b.emit(
            oid(j, "recompute"),
            K.RECOMPUTE,
            "gpu",
            step=step,
            unit=j,
            work=layer_work(m, c, backward=False),
            deps=[ctx.weights_ready.get(j), ctx.act_ready.pop(j)],
            acquire=["gpu_workspace"],
        )
        b.emit(
            oid(j, "bwd"),
            K.BWD,
            "gpu",
            step=step,
            unit=j,
            work=layer_work(m, c, backward=True),
            release=[ctx.workspace, ctx.act_gpu.pop(j)],
        )
        after_bwd(j)
    b.emit(oid(0, "bwd"), K.BWD, "gpu", step=step, unit=0, work=Work(bytes=ctx.hidden_bytes))
    after_bwd(0)


def layer_work(model: ModelSpec, config: TrainConfig, *, backward: bool) -> Work:
    """One decoder layer's forward (or recompute) or backward: matmul and attention FLOPs, and
    the elementwise kernels' HBM traffic (the backward's is about twice the forward's)."""
    bs = (config.batch, config.seq)
    scale = 2 if backward else 1
    return Work(
        flops=scale * model.layer_fwd_flops(*bs),
        attn_flops=scale * model.attention_fwd_flops(*bs),
        bytes=scale * model.layer_elementwise_bytes(*bs),
    )


def _save_activation(ctx: Ctx, step: int, micro: int, i: int) -> None:
    """Copy layer i's input to pinned memory (and on to NVMe) once layer i has read it."""
    b, hb = ctx.b, ctx.hidden_bytes

    def oid(w: str) -> str:
        return ctx.oid(step, micro, i, w)

    home = "pinned_acts" if ctx.config.activations == "cpu" else "pinned_act_staging"
    (slot,) = b.emit(
        oid("act.save"),
        K.ACT_SAVE,
        "d2h",
        step=step,
        unit=i,
        work=Work(bytes=hb),
        deps=[oid("fwd")],
        acquire=[home],
        release=[ctx.act_gpu.pop(i)],
    )
    ctx.act_home[i], ctx.act_home_op[i] = slot, oid("act.save")
    ctx.act_ready.pop(i, None)
    if ctx.config.activations == "nvme":
        (disk,) = b.emit(
            oid("act.write"),
            K.NVME_WRITE,
            _drive(ctx, i),
            step=step,
            unit=i,
            work=Work(bytes=hb),
            deps=[oid("act.save")],
            acquire=["nvme_acts"],
            release=[slot],
        )
        ctx.act_home[i], ctx.act_home_op[i] = disk, oid("act.write")


def read_activation(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """NVMe -> pinned staging, one step ahead of the load to the GPU."""
    if ctx.config.activations != "nvme" or not 1 <= j <= ctx.n or j in ctx.act_gpu:
        return
    if not ctx.act_home_op[j].endswith("act.write"):
        return  # already read
    op_id = ctx.oid(step, micro, j, "act.read")
    (staging,) = ctx.b.emit(
        op_id,
        K.NVME_READ,
        _drive(ctx, j),
        step=step,
        unit=j,
        work=Work(bytes=ctx.hidden_bytes),
        deps=[ctx.act_home_op[j]],
        acquire=["pinned_act_staging"],
        release=[ctx.act_home[j]],
    )
    ctx.act_home[j], ctx.act_home_op[j] = staging, op_id


def load_activation(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """Bring layer j's saved input back to the GPU (no-op when it never left or is back)."""
    if ctx.config.activations == "gpu" or not 1 <= j <= ctx.n or j in ctx.act_gpu:
        return
    read_activation(ctx, step, micro, j)
    op_id = ctx.oid(step, micro, j, "act.load")
    (slot,) = ctx.b.emit(
        op_id,
        K.ACT_LOAD,
        "h2d",
        step=step,
        unit=j,
        work=Work(bytes=ctx.hidden_bytes),
        deps=[ctx.act_home_op.pop(j)],
        acquire=["gpu_acts"],
        release=[ctx.act_home.pop(j)],
    )
    ctx.act_gpu[j], ctx.act_ready[j] = slot, op_id


def prefetch_activations(ctx: Ctx, step: int, micro: int, layer: int) -> None:
    """Before layer j's recompute: its input and the next `act_buffers - 2` inputs are loaded
    (the ring keeps one slot free), and one more is read from NVMe into pinned staging."""
    reach = ctx.config.act_buffers - 2
    for j in range(layer, layer - reach - 1, -1):
        load_activation(ctx, step, micro, j)
    read_activation(ctx, step, micro, layer - reach - 1)


def _drive(ctx: Ctx, layer: int) -> str:
    """Activations go to drives round-robin by layer: whole tensors, no striping."""
    return f"nvme{layer % ctx.drives}"


def adam_work(ctx: Ctx, unit: int) -> Work:
    p = unit_params(ctx.model, unit)
    return Work(elements=p, bytes=p * adam_bytes_per_param(ctx.config))


def gpu_adam_work(ctx: Ctx, unit: int) -> Work:
    """The GPU AdamW of a resident or streamed unit as the executor runs it: the host update's 28 B/param,
    plus the BF16 gradient's FP32 upcast through a temporary (written, then read: 8 B) and the
    BF16 weights re-read from the updated FP32 master (4 B more than the fused cast counted)."""
    p = unit_params(ctx.model, unit)
    return Work(elements=p, bytes=p * (adam_bytes_per_param(ctx.config) + 3 * FP32))


def grad_accum_work(ctx: Ctx, unit: int) -> Work:
    """Read the landed BF16 grads, read-modify-write the FP32 accumulator."""
    p = unit_params(ctx.model, unit)
    return Work(elements=p, bytes=p * (BF16 + 2 * FP32))


def param_bytes(ctx: Ctx, unit: int) -> int:
    return unit_params(ctx.model, unit) * BF16


def unit_group(ctx: Ctx, unit: int) -> str:
    """Pools are per unit size: the embedding, the decoder layers, the head."""
    return "embed" if unit == 0 else "head" if unit == ctx.n + 1 else "layers"


class OptimizerIo:
    """Optimizer state on NVMe: read a unit's state ahead of its update (striped over every
    drive), write it back after. `prefetch(order, q)` reads units order[q] and order[q + 1]."""

    def __init__(self, ctx: Ctx, step: int) -> None:
        self.ctx, self.step = ctx, step
        self.reads: dict[int, list[str]] = {}
        self.staging: dict[int, tuple[str, ...]] = {}
        self.on_nvme = {
            "cpu": 0,
            "nvme": FP32 + ctx.config.moment_bytes,
            "nvme-moments": ctx.config.moment_bytes,
        }[ctx.config.optimizer]

    def prefetch(self, order: list[int], q: int) -> list[str]:
        """Emit the reads of order[q] (if not yet) and order[q + 1]; returns order[q]'s reads."""
        if not self.on_nvme:
            return []
        for u in order[q : q + 2]:
            if u not in self.reads:
                self._read(u)
        return self.reads[order[q]]

    def _read(self, unit: int) -> None:
        ctx, d = self.ctx, self.ctx.drives
        share = -(-unit_params(ctx.model, unit) * self.on_nvme // d)
        ids, slots = [], []
        for k in range(d):
            op_id = ctx.sid(self.step, unit, f"opt.read{k}")
            (slot,) = ctx.b.emit(
                op_id,
                K.NVME_READ,
                f"nvme{k}",
                step=self.step,
                unit=unit,
                work=Work(bytes=share),
                deps=[ctx.last_update.get(unit)],
                acquire=[f"opt_staging_{unit_group(ctx, unit)}"],
            )
            ids.append(op_id)
            slots.append(slot)
        self.reads[unit], self.staging[unit] = ids, tuple(slots)

    def update(
        self, order: list[int], unit: int, *, deps: list[str], release: tuple[str, ...] = ()
    ) -> None:
        """The CPU AdamW of `unit` (state read ahead from NVMe first, written back after);
        `order` is the order the updates are emitted in, for the read-ahead."""
        ctx = self.ctx
        reads = self.prefetch(order, order.index(unit))
        op_id = ctx.sid(self.step, unit, "adam")
        ctx.b.emit(op_id, K.ADAM, "cpu", step=self.step, unit=unit, work=adam_work(ctx, unit),
                   deps=[*deps, *reads], release=release)  # fmt: skip
        self.write_back(unit, op_id)
        ctx.last_update[unit] = op_id

    def write_back(self, unit: int, update_op: str) -> None:
        """Emit the writes after `update_op`. The next step's read of the same stripe comes
        later on the same drive's lane, so lane order keeps it behind its write."""
        if not self.on_nvme:
            return
        ctx, d = self.ctx, self.ctx.drives
        share = -(-unit_params(ctx.model, unit) * self.on_nvme // d)
        for k, slot in enumerate(self.staging.pop(unit)):
            ctx.b.emit(
                ctx.sid(self.step, unit, f"opt.write{k}"),
                K.NVME_WRITE,
                f"nvme{k}",
                step=self.step,
                unit=unit,
                work=Work(bytes=share),
                deps=[update_op],
                release=[slot],
            )
