"""The compute chain every schedule shares: forward, fused loss, checkpointed backward.

Units ("unit" in op ids): 0 embedding, 1..n decoder layers, n+1 head. Every schedule uses
sliding activation checkpointing: each decoder layer's input is saved (kept on the GPU, or copied
to pinned CPU memory, or on to NVMe), brought back ahead of the backward, and the layer recomputed.
Except the `taped` layers (the top ones, `TrainConfig.keep_activations`): their forward records
`s1.L3.tape` into a `gpu_tapes` slot and frees its input, and their backward reads that tape.
Schedules differ in where weights come from and where gradients go; they plug in through the
`before_*` / `after_bwd` hooks. Every op names the values it reads and writes (`slide_ir.planning.values`):
the forward passes `s1.L3.x` from slot to slot, the recompute leaves `s1.L3.tape` in the
workspace for the backward, the backward passes `s1.L3.dx` down a two-slot ring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from slide_ir.ir.drives import act_drive, act_pool
from slide_ir.ir.graph import OpKind, PoolRole, Role, Value, Work, slot_id
from slide_ir.planning.builder import GraphBuilder, Taken
from slide_ir.planning.compute_terms import lce_chunk_tokens
from slide_ir.planning.shapes import eval_loss_work, layer_work, loss_work
from slide_ir.planning.units import BF16, FP32, adam_bytes_per_param, unit_params
from slide_ir.planning.values import at, grads, micro_prefix, unit_homes, unit_value, weights
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

K = OpKind
R = PoolRole


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
    taped: frozenset[int] = frozenset()  # layers whose forward keeps its tape (no recompute)
    tape_slot: dict[int, str] = field(default_factory=dict)  # taped layer -> its tape's slot
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
    hidden_grad: dict[int, str] = field(default_factory=dict)  # unit -> GPU slot of its dx
    persistent_grads: frozenset[int] = frozenset()  # units whose GPU grads outlive a micro-batch
    grads_written: set[int] = field(default_factory=set)  # units with grads in this micro-batch
    homes: dict[tuple[PoolRole, int], str] = field(default_factory=dict)  # see `unit_homes`
    tokens_slot: str = ""
    # an eval graph's forward (`evaluation`): every unit and input freed once read, nothing
    # saved for a backward, and the loss computed without its gradients
    forward_only: bool = False
    cast: frozenset[int] = frozenset()  # units whose uploads are cast into the weight ring
    # global clipping: units whose update speculates, its old state saved (`speculation`)
    speculated: frozenset[int] = frozenset()
    # False: the ops name no values (the placement search's candidates, which are only timed:
    # a third of their building time); the helpers below then return None, which emit drops
    values: bool = True

    # per-build caches: the placement search builds a graph per candidate, and recomputing a
    # layer's FLOPs or a unit's size for every op was a tenth of that time
    _params: dict[int, int] = field(default_factory=dict)
    _layer_work: dict[bool, Work] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.homes = unit_homes(self.b.pools)
        tokens = [p for p in self.b.pools if p.role == PoolRole.TOKENS]
        self.tokens_slot = slot_id(tokens[0].name, 0) if tokens else ""
        ring = [p for p in self.b.pools if p.role == PoolRole.WEIGHT_STAGING]
        self.cast = frozenset(u for p in ring for u in p.units)
        saved = [p for p in self.b.pools if p.role == PoolRole.ROLLBACK]
        self.speculated = frozenset(u for p in saved for u in p.units)

    def params(self, unit: int) -> int:
        """`unit_params` of `unit`, computed once per build."""
        if unit not in self._params:
            self._params[unit] = unit_params(self.model, unit)
        return self._params[unit]

    def layer_work(self, *, backward: bool) -> Work:
        """`layer_work` of this build's model and shape (every decoder layer's is the same)."""
        if backward not in self._layer_work:
            self._layer_work[backward] = layer_work(self.model, self.config, backward=backward)
        return self._layer_work[backward]

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

    # -- values ----------------------------------------------------------------------------
    def hidden(self, step: int, micro: int, unit: int, what: str) -> str:
        """`s1.L3.x` (unit 3's input), `s1.L3.dx` (its gradient), `s1.L3.tape`."""
        return self.oid(step, micro, unit, what)

    def at(
        self, name: str, slot: str, *, accumulate: bool = False, role: Role = Role.MAIN
    ) -> Value | None:
        return at(name, slot, accumulate=accumulate, role=role) if self.values else None

    def taken(self, name: str, index: int = 0, role: Role = Role.MAIN) -> Taken | None:
        return Taken(name, index, role=role) if self.values else None

    def tokens(self, step: int, micro: int) -> Value | None:
        if not self.values:
            return None
        name = micro_prefix(step, micro, self.config.grad_accum) + "tokens"
        return at(name, self.tokens_slot, role=Role.TOKENS)

    def on_gpu(self, unit: int) -> str:
        """The GPU slot holding the unit's weights (and grads) now."""
        slot = self.unit_slot.get(unit) or self.homes.get((R.RESIDENT, unit))
        return slot or self.homes[(R.DEVICE_WEIGHTS, unit)]

    def grads_on_gpu(self, unit: int) -> str:
        slot = self.unit_slot.get(unit) or self.homes.get((R.RESIDENT, unit))
        return slot or self.homes[(R.DEVICE_GRADS, unit)]

    def weights_read(self, unit: int, role: Role = Role.MAIN) -> Value | None:
        if not self.values:
            return None
        return at(weights(unit), self.on_gpu(unit), role=role)

    def grads_write(self, unit: int, micro: int, role: Role = Role.MAIN) -> Value | None:
        """The unit's GPU gradient as the next op writes it: the first write of a micro-batch
        overwrites (unless the gradient persists across micro-batches), later ones add (a tied
        embedding gets the LM head's gradient, then the lookup's)."""
        if not self.values:
            return None
        acc = unit in self.grads_written or (unit in self.persistent_grads and micro > 0)
        self.grads_written.add(unit)
        return at(grads(unit), self.grads_on_gpu(unit), accumulate=acc, role=role)

    def home(self, role: PoolRole, unit: int, what: str) -> Value | None:
        if not self.values:
            return None
        return at(unit_value(unit, what), self.homes[(role, unit)])


Hook = Callable[[int], None]


def forward(ctx: Ctx, step: int, micro: int, before_layer: Hook) -> None:
    """Embedding, decoder layers 1..n, then the fused loss (LCE: forward and backward at once).
    `before_layer(u)` runs before unit u's compute is emitted (to issue prefetches)."""
    m, c, n, b = ctx.model, ctx.config, ctx.n, ctx.b

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    b.micro = micro  # what follows, up to the next micro-batch's forward, belongs to it
    before_layer(0)
    ctx.grads_written.clear()
    # forward only: the embedding's slot is free after its lookup, unless the LM head reads it
    embedding_done = ctx.forward_only and not m.tied_embeddings and 0 in ctx.unit_slot
    (x1,) = b.emit(
        oid(0, "fwd"),
        K.FWD,
        "gpu",
        step=step,
        unit=0,
        work=Work(bytes=ctx.hidden_bytes),
        deps=[ctx.weights_ready.get(0)],
        acquire=["gpu_acts"],
        reads=[ctx.weights_read(0)],  # before the release below gives its slot up
        release=[ctx.unit_slot.pop(0) if embedding_done else None],
        writes=[ctx.taken(oid(1, "x")), ctx.tokens(step, micro)],
    )
    ctx.act_gpu[1], ctx.act_ready[1] = x1, oid(0, "fwd")
    for i in range(1, n + 1):
        before_layer(i)
        done_with_unit = i not in ctx.kept and i in ctx.unit_slot
        taped = i in ctx.taped
        input_done = taped or ctx.forward_only
        slots = b.emit(
            oid(i, "fwd"),
            K.FWD,
            "gpu",
            step=step,
            unit=i,
            work=ctx.layer_work(backward=False),
            deps=[ctx.weights_ready.get(i)],
            acquire=["gpu_acts", "gpu_tapes"] if taped else ["gpu_acts"],
            scratch=["gpu_workspace"],
            release=[ctx.unit_slot[i] if done_with_unit else None,
                     ctx.act_gpu[i] if input_done else None],
            reads=[ctx.weights_read(i), ctx.at(oid(i, "x"), ctx.act_gpu[i])],
            writes=[ctx.taken(oid(i + 1, "x")),
                    ctx.taken(oid(i, "tape"), 1, Role.TAPE) if taped else None],
        )  # fmt: skip
        if done_with_unit:
            del ctx.unit_slot[i]
        ctx.act_gpu[i + 1], ctx.act_ready[i + 1] = slots[0], oid(i, "fwd")
        if taped:
            ctx.tape_slot[i] = slots[1]
        if input_done:
            del ctx.act_gpu[i], ctx.act_ready[i]
        elif c.activations != "gpu":
            _save_activation(ctx, step, micro, i)
    before_layer(n + 1)
    if ctx.forward_only:
        _eval_loss(ctx, step, micro)
        return
    head, tied = n + 1, m.tied_embeddings
    (ctx.hidden_grad[head],) = b.emit(
        oid(n + 1, "loss"),
        K.LOSS,
        "gpu",
        step=step,
        unit=n + 1,
        work=loss_work(m, c, lce_chunk_tokens(m, c)),
        deps=[ctx.weights_ready.get(n + 1)],
        acquire=["gpu_hidden_grads"],
        scratch=["gpu_workspace"],
        release=[ctx.act_gpu[head]],
        reads=[ctx.weights_read(head), ctx.at(oid(head, "x"), ctx.act_gpu.pop(head)),
               ctx.tokens(step, micro), ctx.weights_read(0, Role.TIED) if tied else None],
        writes=[ctx.grads_write(head, micro), ctx.taken(oid(head, "dx")),
                ctx.grads_write(0, micro, Role.TIED) if tied else None],
    )  # fmt: skip


def _eval_loss(ctx: Ctx, step: int, micro: int) -> None:
    """The head's forward only: the batch's summed token loss, no gradient written; the head's
    input, and the head's (and a tied embedding's) cache slots, are free after it."""
    head, tied = ctx.n + 1, ctx.model.tied_embeddings
    x = ctx.act_gpu.pop(head)
    ctx.act_ready.pop(head)
    reads = [ctx.weights_read(head), ctx.at(ctx.hidden(step, micro, head, "x"), x),
             ctx.tokens(step, micro), ctx.weights_read(0, Role.TIED) if tied else None]  # fmt: skip
    done = [head, 0] if tied else [head]
    ctx.b.emit(
        ctx.oid(step, micro, head, "loss"),
        K.EVAL_LOSS,
        "gpu",
        step=step,
        unit=head,
        work=eval_loss_work(ctx.model, ctx.config, lce_chunk_tokens(ctx.model, ctx.config)),
        deps=[ctx.weights_ready.get(head)],
        scratch=["gpu_workspace"],
        release=[x, *(ctx.unit_slot.pop(u) for u in done if u in ctx.unit_slot)],
        reads=reads,
    )  # fmt: skip


def backward(ctx: Ctx, step: int, micro: int, before_layer: Hook, after_bwd: Hook) -> None:
    """Layers n..1: (load input,) recompute, backward; then the embedding's backward.
    `before_layer(j)` issues prefetches; `after_bwd(u)` sends unit u's gradients on."""
    b = ctx.b

    def oid(u: int, w: str) -> str:
        return ctx.oid(step, micro, u, w)

    for j in range(ctx.n, 0, -1):
        before_layer(j)
        if j in ctx.taped:
            _taped_backward(ctx, step, micro, j)
            after_bwd(j)
            continue
        (ctx.workspace,) = b.emit(
            oid(j, "recompute"),
            K.RECOMPUTE,
            "gpu",
            step=step,
            unit=j,
            work=ctx.layer_work(backward=False),
            deps=[ctx.weights_ready.get(j), ctx.act_ready.pop(j)],
            acquire=["gpu_workspace"],
            reads=[ctx.weights_read(j), ctx.at(oid(j, "x"), ctx.act_gpu[j])],
            writes=[ctx.taken(oid(j, "tape"), role=Role.TAPE)],
        )
        dx_in = ctx.hidden_grad.pop(j + 1)
        (ctx.hidden_grad[j],) = b.emit(
            oid(j, "bwd"),
            K.BWD,
            "gpu",
            step=step,
            unit=j,
            work=ctx.layer_work(backward=True),
            acquire=["gpu_hidden_grads"],
            release=[ctx.workspace, ctx.act_gpu.pop(j), dx_in],
            reads=[ctx.weights_read(j), ctx.at(oid(j, "tape"), ctx.workspace, role=Role.TAPE),
                   ctx.at(oid(j + 1, "dx"), dx_in)],
            writes=[ctx.grads_write(j, micro), ctx.taken(oid(j, "dx"))],
        )  # fmt: skip
        after_bwd(j)
    dx_in = ctx.hidden_grad.pop(1)
    b.emit(oid(0, "bwd"), K.BWD, "gpu", step=step, unit=0, work=Work(bytes=ctx.hidden_bytes),
           release=[dx_in], reads=[ctx.weights_read(0), ctx.tokens(step, micro),
                                   ctx.at(oid(1, "dx"), dx_in)],
           writes=[ctx.grads_write(0, micro)])  # fmt: skip
    after_bwd(0)


def _taped_backward(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """The backward of a layer whose forward kept its tape: no recompute, no saved input."""
    dx_in, tape = ctx.hidden_grad.pop(j + 1), ctx.tape_slot.pop(j)
    (ctx.hidden_grad[j],) = ctx.b.emit(
        ctx.oid(step, micro, j, "bwd"),
        K.BWD,
        "gpu",
        step=step,
        unit=j,
        work=ctx.layer_work(backward=True),
        deps=[ctx.weights_ready.get(j)],
        acquire=["gpu_hidden_grads"],
        scratch=["gpu_workspace"],
        release=[tape, dx_in],
        reads=[ctx.weights_read(j), ctx.at(ctx.hidden(step, micro, j, "tape"), tape, role=Role.TAPE),
               ctx.at(ctx.hidden(step, micro, j + 1, "dx"), dx_in)],
        writes=[ctx.grads_write(j, micro), ctx.taken(ctx.hidden(step, micro, j, "dx"))],
    )  # fmt: skip


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
        release=[ctx.act_gpu[i]],
        reads=[ctx.at(oid("x"), ctx.act_gpu.pop(i))],
        writes=[ctx.taken(oid("x"))],
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
            acquire=[act_pool(act_drive(i, ctx.drives))],
            release=[slot],
            reads=[ctx.at(oid("x"), slot)],
            writes=[ctx.taken(oid("x"))],
        )
        ctx.act_home[i], ctx.act_home_op[i] = disk, oid("act.write")


def read_activation(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """NVMe -> pinned staging, one step ahead of the load to the GPU."""
    if ctx.config.activations != "nvme" or not 1 <= j <= ctx.n or j in ctx.act_gpu:
        return
    if j in ctx.taped:
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
        reads=[ctx.at(ctx.hidden(step, micro, j, "x"), ctx.act_home[j])],
        writes=[ctx.taken(ctx.hidden(step, micro, j, "x"))],
    )
    ctx.act_home[j], ctx.act_home_op[j] = staging, op_id


def load_activation(ctx: Ctx, step: int, micro: int, j: int) -> None:
    """Bring layer j's saved input back to the GPU (no-op when it never left or is back)."""
    if ctx.config.activations == "gpu" or not 1 <= j <= ctx.n or j in ctx.act_gpu:
        return
    if j in ctx.taped:
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
        release=[ctx.act_home[j]],
        reads=[ctx.at(ctx.hidden(step, micro, j, "x"), ctx.act_home.pop(j))],
        writes=[ctx.taken(ctx.hidden(step, micro, j, "x"))],
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
    """The lane of the drive that holds a layer's saved input."""
    return f"nvme{act_drive(layer, ctx.drives)}"


def device_update(
    ctx: Ctx, step: int, unit: int, deps: list[str] | None = None, scale: Value | None = None
) -> str:
    """The GPU AdamW of a unit whose weights, grads and state live on the GPU; its op id.
    Under global clipping it waits for the step's norm (`deps`) and reads its `scale`."""
    op_id, slot = ctx.sid(step, unit, "gpu_adam"), ctx.on_gpu(unit)
    state = ctx.home(R.RESIDENT, unit, "state")
    ctx.b.emit(op_id, K.GPU_ADAM, "gpu", step=step, unit=unit, work=gpu_adam_work(ctx, unit),
               deps=deps or [], reads=[ctx.at(grads(unit), slot), state, scale],
               writes=[ctx.at(weights(unit), slot), state])  # fmt: skip
    return op_id


def adam_work(ctx: Ctx, unit: int, *, saved: int = 0) -> Work:
    """The host AdamW's pass over a unit, writing `saved` more bytes per parameter on the way
    (a speculative update's rollback copy)."""
    p = ctx.params(unit)
    nbytes = adam_bytes_per_param(ctx.config, weight_copy=unit not in ctx.cast) + saved
    return Work(elements=p, bytes=p * nbytes)


def gpu_adam_work(ctx: Ctx, unit: int) -> Work:
    """The GPU AdamW of a resident or streamed unit as the executor runs it: the host update's 28 B/param,
    plus the BF16 gradient's FP32 upcast through a temporary (written, then read: 8 B) and the
    BF16 weights re-read from the updated FP32 master (4 B more than the fused cast counted)."""
    p = ctx.params(unit)
    return Work(elements=p, bytes=p * (adam_bytes_per_param(ctx.config) + 3 * FP32))


def grad_accum_work(ctx: Ctx, unit: int) -> Work:
    """Read the landed BF16 grads, read-modify-write the FP32 accumulator."""
    p = ctx.params(unit)
    return Work(elements=p, bytes=p * (BF16 + 2 * FP32))


def param_bytes(ctx: Ctx, unit: int) -> int:
    return ctx.params(unit) * BF16


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
        share = -(-ctx.params(unit) * self.on_nvme // d)
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
                reads=[ctx.home(R.NVME_STATE, unit, f"state{k}")],
                writes=[ctx.taken(unit_value(unit, f"state{k}"))],
            )
            ids.append(op_id)
            slots.append(slot)
        self.reads[unit], self.staging[unit] = ids, tuple(slots)

    def update(
        self,
        order: list[int],
        unit: int,
        *,
        deps: list[str],
        grads: Value | None = None,
        release: tuple[str, ...] = (),
        scale: Value | None = None,
        rollback: Value | None = None,
    ) -> str:
        """The CPU AdamW of `unit` from its landed `grads` (state read ahead from NVMe first,
        written back after; its pinned weight copy written unless its uploads cast); `order` is
        the order the updates are emitted in, for the read-ahead. With several micro-batches
        the landed gradient is added into the accumulator first (no `grads`: it already was).
        Under global clipping it reads the step's `scale`, or speculates: writes the state as it
        was into `rollback` on the way, for the step's `REDO`."""
        ctx = self.ctx
        reads = self.prefetch(order, order.index(unit))
        op_id = ctx.sid(self.step, unit, "adam")
        acc = ctx.home(R.GRAD_ACCUM, unit, "gacc") if ctx.config.grad_accum > 1 else None
        state = self._state(unit)
        added = acc and ctx.at(acc.name, acc.slot, accumulate=True) if grads else None
        copy = None if unit in ctx.cast else ctx.home(R.HOST_WEIGHTS, unit, "w")
        # the saved state goes to lines not in cache: each is read before it is written
        # (write-allocate), 2 x 12 B/param with FP32 moments; on the H200's host a speculative
        # update of a 3B layer took 55-96 ms (~2.2x) against 29-40 ms deferred
        # (by the unit, not `rollback`: the search's graphs are built without values)
        saved = 2 * (FP32 + ctx.config.moment_bytes) if unit in ctx.speculated else 0
        ctx.b.emit(op_id, K.ADAM, "cpu", step=self.step, unit=unit,
                   work=adam_work(ctx, unit, saved=saved), deps=[*deps, *reads], release=release,
                   reads=[grads, acc, scale, *state], writes=[added, copy, *state, rollback])  # fmt: skip
        self.write_back(unit, op_id)
        ctx.last_update[unit] = op_id
        return op_id

    def _state(self, unit: int) -> list[Value | None]:
        """Where the update finds the unit's master and moments: RAM, or the staging slots of
        its NVMe stripes (and the master in RAM when only the moments are on NVMe)."""
        ctx = self.ctx
        master = ctx.home(R.MASTER, unit, "master") if (R.MASTER, unit) in ctx.homes else None
        if not self.on_nvme:
            return [master, ctx.home(R.MOMENTS, unit, "moments")]
        stripes = [
            ctx.at(unit_value(unit, f"state{k}"), s) for k, s in enumerate(self.staging[unit])
        ]
        return [*([master] if master else []), *stripes]

    def write_back(self, unit: int, update_op: str) -> None:
        """Emit the writes after `update_op`. The next step's read of the same stripe comes
        later on the same drive's lane, so lane order keeps it behind its write."""
        if not self.on_nvme:
            return
        ctx, d = self.ctx, self.ctx.drives
        share = -(-ctx.params(unit) * self.on_nvme // d)
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
                reads=[ctx.at(unit_value(unit, f"state{k}"), slot)],
                writes=[ctx.home(R.NVME_STATE, unit, f"state{k}")],
            )
