"""The emitters' shared state: `Ctx`, what every schedule's emitter needs (the model, the config,
the graph builder) plus the facts that cross layer and step boundaries (which slot holds a unit,
which op made it ready), and the value names its ops read and write.

Invariant: a `Ctx` serves one graph build (its caches are per build). With `values=False` (the
placement search's candidates) the value helpers return None, which `GraphBuilder.emit` drops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slide_ir.ir.graph import FEED_AHEAD, OpKind, PoolRole, Role, Value, Work, slot_id
from slide_ir.planning.builder import GraphBuilder, Taken
from slide_ir.planning.shapes import layer_work, recompute_work
from slide_ir.planning.units import BF16, FP32, unit_params
from slide_ir.planning.values import at, grads, micro_prefix, unit_homes, unit_value, weights
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

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
    # the static pools of the data path (`compute_terms.feed_terms`): role -> pool name
    feed_pools: dict[PoolRole, str] = field(default_factory=dict)
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
    _layer_work: dict[str, Work] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.homes = unit_homes(self.b.pools)
        data = (PoolRole.TOKENS, PoolRole.HOST_TOKENS, PoolRole.LOSSES, PoolRole.HOST_LOSSES)
        self.feed_pools = {p.role: p.name for p in self.b.pools if p.role in data}
        ring = [p for p in self.b.pools if p.role == PoolRole.WEIGHT_STAGING]
        self.cast = frozenset(u for p in ring for u in p.units)
        saved = [p for p in self.b.pools if p.role == PoolRole.ROLLBACK]
        self.speculated = frozenset(u for p in saved for u in p.units)

    def params(self, unit: int) -> int:
        """`unit_params` of `unit`, computed once per build."""
        if unit not in self._params:
            self._params[unit] = unit_params(self.model, unit)
        return self._params[unit]

    def layer_work(self, phase: str) -> Work:
        """A decoder layer's "fwd", "recompute" or "bwd" work at this build's model and shape
        (every decoder layer's is the same)."""
        if phase not in self._layer_work:
            m, c = self.model, self.config
            if phase == "recompute":
                self._layer_work[phase] = recompute_work(m, c)
            else:
                self._layer_work[phase] = layer_work(m, c, backward=phase == "bwd")
        return self._layer_work[phase]

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
        """The micro-batch's tokens on the GPU, in the one slot of the tokens pool."""
        if not self.values:
            return None
        name = micro_prefix(step, micro, self.config.grad_accum) + "tokens"
        return at(name, slot_id(self.feed_pools[PoolRole.TOKENS], 0), role=Role.TOKENS)

    def fed(self, step: int, micro: int) -> Value | None:
        """The micro-batch as the driver staged it in host RAM: a slot per micro-batch of
        `FEED_AHEAD` + 1 steps, in turn (the embedding of step s reuses step s - 1 - FEED_AHEAD's
        slot, after waiting for that step: `schedules.forward`)."""
        if not self.values:
            return None
        name = micro_prefix(step, micro, self.config.grad_accum) + "tokens"
        slot = (step - 1) % (FEED_AHEAD + 1) * self.config.grad_accum + micro
        return at(name, slot_id(self.feed_pools[PoolRole.HOST_TOKENS], slot), role=Role.FEED)

    def losses(self, step: int, micro: int) -> list[Value | None]:
        """What a loss op writes: the step's loss on the GPU (its micro-batches add into it),
        and at the step's last micro-batch its host copy. A slot per step of the pass."""
        if not self.values:
            return []
        name, last = f"s{step}.loss", micro == self.config.grad_accum - 1
        device = at(name, slot_id(self.feed_pools[PoolRole.LOSSES], step - 1),
                    accumulate=micro > 0, role=Role.LOSS)  # fmt: skip
        host = slot_id(self.feed_pools[PoolRole.HOST_LOSSES], step - 1)
        return [device, at(name, host, role=Role.HOST_LOSS) if last else None]

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


def param_bytes(ctx: Ctx, unit: int) -> int:
    return ctx.params(unit) * BF16


def unit_group(ctx: Ctx, unit: int) -> str:
    """Pools are per unit size: the embedding, the decoder layers, the head."""
    return "embed" if unit == 0 else "head" if unit == ctx.n + 1 else "layers"


def h2d_into(
    ctx: Ctx,
    op_id: str,
    kind: OpKind,
    step: int,
    unit: int,
    nbytes: int,
    after: str | None,
    pool: str,
    reads: list[Value | None],
    what: str = "w",
    release: str | None = None,
) -> str:
    """An `h2d` copy of `nbytes` from `reads` into a slot of `pool` (as `L{unit}.{what}`) once
    `after` is done, releasing the host slot `release` read from; returns the slot."""
    (slot,) = ctx.b.emit(op_id, kind, "h2d", step=step, unit=unit, work=Work(bytes=nbytes),
                         deps=[after], acquire=[pool], release=[release], reads=reads,
                         writes=[ctx.taken(f"L{unit}.{what}")])  # fmt: skip
    return slot


def host_state(ctx: Ctx, unit: int) -> list[Value | None]:
    """A streamed unit's FP32 master and moments in pinned RAM."""
    return [ctx.home(R.MASTER, unit, "master"), ctx.home(R.MOMENTS, unit, "moments")]


def state_bytes(ctx: Ctx, unit: int) -> int:
    """FP32 master + both moments of a unit."""
    return ctx.params(unit) * (FP32 + ctx.config.moment_bytes)
