"""Static binding: which buffer every op reads and writes, decided before the run.

The graph names the slots an op acquires and releases, but not what a slot holds at that
moment (which layer's input sits in `gpu_acts.2`, which unit in `gpu_units.0`). One pass over
the ops in list order follows the data and writes it down per op, so at run time lanes share
no mutable bookkeeping: a handler reads its `Bind` and touches exactly those buffers.

Gradient write modes: a unit's parameter gradients are overwritten by the first op that writes
them in a micro-batch, and added to by later ones (a tied embedding gets the LM head's gradient
at LOSS, then the lookup's at the embedding's backward); units whose device gradients persist
across micro-batches (resident, gpu-only) add from the second micro-batch on.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.buffers import Placement
from slide_ir.graph import Graph, Op, OpKind, lane_kind, slot_pool

K = OpKind


@dataclass(frozen=True, kw_only=True, slots=True)
class Bind:
    unit: int
    micro: int = 0  # micro-batch index within the step
    last_micro: bool = True
    weights: str = ""  # buffer key of the unit's device weights + grads (a `GpuUnit`)
    embed: str = ""  # LOSS with tied embeddings: the embedding's `GpuUnit`
    x_in: str = ""  # activation read
    x_out: str = ""  # activation written
    src: str = ""  # copies: source key
    dst: str = ""  # copies: destination key
    hg_in: str = ""  # hidden-state gradient read (w.r.t. the layer's output)
    hg_out: str = ""  # hidden-state gradient written (w.r.t. the layer's input)
    accumulate: bool = False  # parameter gradients add to the buffer (else overwrite)
    accumulate_embed: bool = False  # LOSS, tied: the same for the embedding's gradients
    accum: str = ""  # ADAM / GRAD_ACCUM: the FP32 gradient accumulator
    first: bool = False  # GRAD_ACCUM: first micro-batch of the step (copy instead of add)
    drive: int = 0  # NVMe ops: the lane's drive
    staging: tuple[str, ...] = ()  # ADAM with NVMe state: staging slot of each stripe


def hidden_grad(layer: int) -> str:
    """Gradient w.r.t. layer `layer`'s input: two static slots, used alternately."""
    return f"gpu_hidden_grads.{layer % 2}"


def _taken(op: Op, *pools: str) -> str:
    for slot in op.acquires:
        if slot_pool(slot) in pools or slot_pool(slot).startswith(pools):
            return slot
    raise RuntimeError(f"op {op.id}: acquires no slot of {pools}")


def _freed(op: Op, *pools: str) -> str | None:
    for slot in op.releases:
        if slot_pool(slot).startswith(pools):
            return slot
    return None


class _Binder:
    def __init__(self, graph: Graph, placement: Placement, tied: bool) -> None:
        self.n, self.tied = graph.info.num_layers, tied
        self.grad_accum, self.placement = graph.info.grad_accum, placement
        static = [u for u in placement.units if not placement.is_sliding(u)]
        self.where: dict[int, str] = {u: f"gpu.{u}" for u in static}
        self.act: dict[int, str] = {}  # layer -> device slot holding its input
        self.home: dict[int, str] = {}  # layer -> pinned / NVMe slot of its saved input
        self.landed: dict[int, str] = {}  # unit -> pinned slot its gradients landed in
        self.staging: dict[int, dict[int, str]] = {}  # unit -> stripe -> staging slot
        self.opt_slot: dict[int, str] = {}  # streamed unit -> its GPU state slot
        self.step, self.micro = 0, 0
        self.written: set[int] = set()
        self.accum_started: set[tuple[int, int]] = set()

    def grads_mode(self, unit: int) -> bool:
        """True: add into the unit's gradients; False: overwrite them. Records the write."""
        persists = self.placement.grads_persist(unit)
        acc = unit in self.written or (persists and self.micro > 0)
        self.written.add(unit)
        return acc

    def micro_fields(self) -> dict[str, object]:
        return {"micro": self.micro, "last_micro": self.micro == self.grad_accum - 1}

    def bind(self, op: Op) -> Bind:
        method = getattr(self, f"_{op.kind.value}")
        return method(op)  # type: ignore[no-any-return]

    # -- compute -------------------------------------------------------------------------------
    def _fwd(self, op: Op) -> Bind:
        u = op.unit
        if u == 0:
            self.micro = 0 if op.step != self.step else self.micro + 1
            self.step = op.step
            self.written.clear()
        out = _taken(op, "gpu_acts")
        x_in = self.act[u] if u else ""
        self.act[u + 1] = out
        return Bind(unit=u, weights=self.where[u], x_in=x_in, x_out=out, **self.micro_fields())

    def _recompute(self, op: Op) -> Bind:
        u = op.unit
        return Bind(unit=u, weights=self.where[u], x_in=self.act[u], **self.micro_fields())

    def _bwd(self, op: Op) -> Bind:
        u = op.unit
        self.act.pop(u, None)
        return Bind(
            unit=u,
            weights=self.where[u],
            hg_in=hidden_grad(u + 1),
            hg_out=hidden_grad(u) if u else "",
            accumulate=self.grads_mode(u),
            **self.micro_fields(),
        )

    def _loss(self, op: Op) -> Bind:
        u = op.unit
        return Bind(
            unit=u,
            weights=self.where[u],
            embed=self.where[0] if self.tied else "",
            x_in=self.act.pop(u),
            hg_out=hidden_grad(u),
            accumulate=self.grads_mode(u),
            accumulate_embed=self.grads_mode(0) if self.tied else False,
            **self.micro_fields(),
        )

    def _gpu_adam(self, op: Op) -> Bind:
        u = op.unit
        if u in self.placement.streamed:  # src: the GPU slot its state was uploaded to
            return Bind(unit=u, weights=self.where[u], src=self.opt_slot[u])
        return Bind(unit=u, weights=f"gpu.{u}")

    # -- transfers -----------------------------------------------------------------------------
    def _h2d_param(self, op: Op) -> Bind:
        u = op.unit
        if op.acquires:
            self.where[u] = op.acquires[0]
        return Bind(unit=u, src=f"bf16.{u}", dst=self.where[u])

    def _d2h_grad(self, op: Op) -> Bind:
        u = op.unit
        src = self.where[u]
        if self.placement.is_sliding(u):
            del self.where[u]  # the op releases the unit's device slot
        dst = _taken(op, "pinned_grads_") if op.acquires else f"landing.{u}"
        self.landed[u] = dst
        return Bind(unit=u, src=src, dst=dst)

    def _opt_h2d(self, op: Op) -> Bind:
        u = op.unit
        self.opt_slot[u] = op.acquires[0]
        return Bind(unit=u, dst=op.acquires[0])

    def _opt_d2h(self, op: Op) -> Bind:
        return Bind(unit=op.unit, src=self.opt_slot.pop(op.unit))

    def _w_d2h(self, op: Op) -> Bind:
        u = op.unit
        return Bind(unit=u, src=self.where.pop(u), dst=f"bf16.{u}")

    def _act_save(self, op: Op) -> Bind:
        src, dst = self.act.pop(op.unit), op.acquires[0]
        self.home[op.unit] = dst
        return Bind(unit=op.unit, src=src, dst=dst)

    def _act_load(self, op: Op) -> Bind:
        src, dst = self.home.pop(op.unit), op.acquires[0]
        self.act[op.unit] = dst
        return Bind(unit=op.unit, src=src, dst=dst)

    # -- optimizer -----------------------------------------------------------------------------
    def _grad_accum(self, op: Op) -> Bind:
        u = op.unit
        first = (op.step, u) not in self.accum_started
        self.accum_started.add((op.step, u))
        return Bind(unit=u, src=self.landed.pop(u), dst=f"accum.{u}", first=first)

    def _adam(self, op: Op) -> Bind:
        u = op.unit
        accum = f"accum.{u}" if (op.step, u) in self.accum_started else ""
        stripes = self.staging.pop(u, {})
        return Bind(
            unit=u,
            src=self.landed.pop(u),
            dst=f"bf16.{u}",
            accum=accum,
            staging=tuple(stripes[k] for k in sorted(stripes)),
        )

    def _cast(self, op: Op) -> Bind:
        return Bind(unit=op.unit, src=f"master.{op.unit}", dst=f"bf16.{op.unit}")

    # -- NVMe ----------------------------------------------------------------------------------
    def _nvme_write(self, op: Op) -> Bind:
        u, drive = op.unit, _drive(op)
        staging = _freed(op, "opt_staging_")
        if staging is not None:  # optimizer state back to its stripe
            return Bind(unit=u, src=staging, drive=drive)
        src, dst = self.home[u], _taken(op, "nvme_acts")
        self.home[u] = dst
        return Bind(unit=u, src=src, dst=dst, drive=drive)

    def _nvme_read(self, op: Op) -> Bind:
        u, drive = op.unit, _drive(op)
        if any(slot_pool(s).startswith("opt_staging_") for s in op.acquires):
            dst = _taken(op, "opt_staging_")
            self.staging.setdefault(u, {})[drive] = dst
            return Bind(unit=u, dst=dst, drive=drive)
        src, dst = self.home[u], _taken(op, "pinned_act_staging")
        self.home[u] = dst
        return Bind(unit=u, src=src, dst=dst, drive=drive)


def _drive(op: Op) -> int:
    assert lane_kind(op.lane) == "nvme", op.id
    return int(op.lane[len("nvme") :])


def bind_graph(graph: Graph, placement: Placement, *, tied: bool) -> dict[str, Bind]:
    """op id -> its Bind, for every op of `graph`."""
    binder = _Binder(graph, placement, tied)
    return {op.id: binder.bind(op) for op in graph.ops}
