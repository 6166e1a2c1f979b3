"""Every buffer of a run, allocated once from the Graph's pools before the first op.

Allocation is a table keyed by the pool's role (`ALLOCATORS`), sized by the units its slots
hold (`Pool.units`): no pool names are read. Keys are the graph's slot ids (`gpu_units.1`,
`pinned_acts.3`, `gpu_tokens.0`, ...) where a slot holds one thing, and per-unit keys where a
pool holds units side by side or one per slot (`UNIT_KEYS`): `gpu.{u}` (a `GpuUnit` living on
the device: resident, ZeRO-offload, gpu-only), `devopt.{u}` (its device FP32 master + moments),
`bf16.{u}` (pinned compute-dtype copy the next upload reads), `master.{u}`, `moments.{u}`,
`accum.{u}` (host FP32; pinned for streamed units), `landing.{u}` (ZeRO-offload's FP32 gradient
landing). `Buffers.key(value, unit)` finds an op's value: its slot, or the unit's key there. A
streamed unit's GPU slot is an `OptState` sized to its pool's largest unit. A pool's bytes per
element say its dtype: 4 is FP32, 2 (the ledger's BF16) the compute dtype (FP32 in CPU tests:
twice the bytes); a pool whose slot is one array (hidden states, a micro-batch's tokens, a
step's loss) has it as `Pool.shape`. The GPU workspace is not pre-allocated by hand: autograd
and the LCE kernel take it from torch's caching allocator on step 1 and reuse the same segments
afterwards (the GPU test checks it stays flat).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from executor.host_memory import HostMemory, host_empty
from executor.layout import Shard, UnitLayout
from executor.staging import TokenSlot
from slide_ir.ir.graph import Dtype, Graph, Pool, PoolRole, Tier, Value
from slide_ir.specs.model import ModelSpec

log = logging.getLogger("executor.buffers")

R = PoolRole
# roles of pools that are not buffers of the run: accounting only (context, runtime, DeepSpeed's
# staging, the final state's host copy), torch's workspaces and kept tapes, NVMe regions (files)
NOT_ALLOCATED = frozenset({R.ACCOUNTING, R.WORKSPACE, R.TAPE, R.NVME_HIDDEN, R.NVME_STATE,
                           R.NVME_GRADS})  # fmt: skip
# roles whose pools hold units side by side or one per slot: an op's value there is the unit's
UNIT_KEYS = {R.HOST_WEIGHTS: "bf16", R.MASTER: "master", R.MOMENTS: "moments",
             R.GRAD_ACCUM: "accum", R.GRAD_LANDING: "landing", R.RESIDENT: "gpu",
             R.DEVICE_WEIGHTS: "gpu", R.DEVICE_GRADS: "gpu", R.ROLLBACK: "rollback"}  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuUnit:
    """A unit's compute-dtype weights `w` and gradients `g` on the device, flat each. Two
    allocations, not one: autograd tracks in-place writes per storage, and gradients are
    accumulated in place while the weights are saved for backward."""

    w: torch.Tensor
    g: torch.Tensor


@dataclass(frozen=True, kw_only=True, slots=True)
class OptState:
    """FP32 master weights and the two Adam moments (m, v) of one unit (or one stripe of it)."""

    master: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True, kw_only=True, slots=True)
class Setup:
    """What allocation needs to know besides the graph."""

    spec: ModelSpec
    layouts: dict[int, UnitLayout]
    shards: dict[int, Shard]  # what this rank holds of each unit's host and optimizer state
    nproc: int  # data-parallel ranks: a unit's GPU buffers hold nproc equal parts
    device: torch.device
    dtype: torch.dtype  # compute dtype of weights, grads, activations
    moments_dtype: torch.dtype
    pin: bool  # pinned host memory (CUDA only)
    stripes: int  # NVMe drives the optimizer state is striped over (0: none)
    opt_on_nvme: tuple[str, ...] = ()  # which of "master", "moments" live on NVMe


@dataclass(kw_only=True)
class Tokens:
    """The current micro-batch on the device (the `tokens` pool's slot), written by the
    embedding's forward; `scale` = 1 / labelled tokens of its step."""

    ids: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None  # packed documents: each token's place in its own
    scale: float = 1.0


@dataclass(kw_only=True)
class Buffers:
    host: HostMemory
    items: dict[str, object] = field(default_factory=dict)
    allocated: dict[str, int] = field(default_factory=dict)  # pool -> bytes actually allocated
    roles: dict[str, PoolRole] = field(default_factory=dict)  # slot id -> its pool's role
    index: dict[str, int] = field(default_factory=dict)  # slot id -> its index in the pool

    def __getitem__(self, key: str):  # type: ignore[no-untyped-def]
        return self.items[key]

    def key(self, v: Value, unit: int) -> str:
        """Where value `v` of an op of `unit` is: its slot, or the unit's key in a pool of units."""
        if v.slot in self.items:
            return v.slot
        return f"{UNIT_KEYS[self.roles[v.slot]]}.{unit}"

    def tensor(self, key: str) -> torch.Tensor:
        item = self.items[key]
        assert isinstance(item, torch.Tensor), key
        return item

    def gpu_unit(self, key: str) -> GpuUnit:
        item = self.items[key]
        assert isinstance(item, GpuUnit), key
        return item

    def of(self, v: Value, unit: int) -> torch.Tensor:
        """The tensor holding value `v` of `unit`."""
        return self.tensor(self.key(v, unit))

    def unit_at(self, v: Value, unit: int) -> GpuUnit:
        """The device weights + grads that value `v` (a unit's `w` or `g`) lives in."""
        return self.gpu_unit(self.key(v, unit))

    def state_at(self, v: Value, unit: int) -> OptState:
        """The master and moments value `v` (a speculated unit's rollback copy) lives in."""
        item = self.items[self.key(v, unit)]
        assert isinstance(item, OptState), v
        return item

    def tokens(self, v: Value) -> Tokens:
        item = self.items[v.slot]
        assert isinstance(item, Tokens), v
        return item

    def fed(self, v: Value) -> TokenSlot:
        """The host slot a micro-batch was staged in (`Role.FEED`)."""
        item = self.items[v.slot]
        assert isinstance(item, TokenSlot), v
        return item


def _dev(s: Setup, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype, device=s.device)


def _gpu_unit(s: Setup, numel: int) -> GpuUnit:
    return GpuUnit(w=_dev(s, numel, s.dtype), g=_dev(s, numel, s.dtype))


def _dev_opt_state(s: Setup, numel: int) -> OptState:
    moments = _dev(s, 2 * numel, s.moments_dtype).zero_()
    return OptState(master=_dev(s, numel, torch.float32), m=moments[:numel], v=moments[numel:])


class _Allocator:
    """One method per pool role (`ALLOCATORS`). Host pools on a pinned tier are pinned (on
    CUDA); pageable ones (master, moments, accumulators) are not."""

    def __init__(self, s: Setup, out: Buffers) -> None:
        self.s, self.out = s, out
        self.device_units: tuple[int, ...] = ()  # units of a DEVICE_WEIGHTS pool

    def host(
        self, pool: Pool, numel: int, dtype: torch.dtype, aligned: bool = False
    ) -> torch.Tensor:
        """`aligned`: for the pools NVMe lanes read and write with O_DIRECT (4096 bytes)."""
        if pool.tier == Tier.PINNED:  # torch's pinned fallback is page-aligned already
            return self.out.host.empty(numel, dtype, aligned)
        return host_empty(numel, dtype, aligned)

    def put(self, pool: Pool, key: str, item: object, nbytes: int) -> None:
        self.out.items[key] = item
        self.out.allocated[pool.name] = self.out.allocated.get(pool.name, 0) + nbytes

    def numel(self, unit: int) -> int:
        """Elements of the rank's shard of `unit` (all of it on one rank)."""
        return self.s.shards[unit].numel

    def padded(self, unit: int) -> int:
        """Elements of `unit`'s GPU weights or gradients: the whole unit, padded to `nproc`
        equal parts for the collectives."""
        return self.s.nproc * -(-self.s.layouts[unit].numel // self.s.nproc)

    def largest(self, pool: Pool) -> int:
        """Elements of the largest shard a slot of `pool` holds."""
        return max(self.numel(u) for u in pool.units)

    def dtype(self, pool: Pool) -> torch.dtype:
        """The torch dtype of the pool's elements (`vocab.Dtype`)."""
        dtypes = {Dtype.COMPUTE: self.s.dtype, Dtype.FP32: torch.float32,
                  Dtype.MOMENTS: self.s.moments_dtype, Dtype.INT64: torch.int64}  # fmt: skip
        if pool.dtype not in dtypes:
            raise ValueError(f"pool {pool.name!r} ({pool.role}) names no element dtype")
        return dtypes[pool.dtype]

    def skip(self, pool: Pool) -> None:
        """Accounting only, torch's workspaces, NVMe regions (files: see `nvme`)."""

    # -- tokens, losses and hidden states ------------------------------------------------------
    def shaped(self, pool: Pool) -> tuple[int, ...]:
        if not pool.shape:
            raise ValueError(f"pool {pool.name!r} ({pool.role}) names no slot shape")
        return pool.shape

    def slot_array(self, pool: Pool) -> torch.Tensor:
        """One slot's array of `pool` (`Pool.shape`, `Pool.dtype`) on its tier; aligned on the
        host, for the NVMe lanes' O_DIRECT."""
        shape, dtype = self.shaped(pool), self.dtype(pool)
        if pool.tier == Tier.GPU:
            return torch.zeros(shape, dtype=dtype, device=self.s.device)
        return self.host(pool, math.prod(shape), dtype, aligned=True).view(shape)

    def tokens(self, pool: Pool) -> None:
        """The micro-batch on the device: (fields, B, S), ids and labels (and positions)."""
        for key in pool.slot_ids():
            t = self.slot_array(pool)
            tokens = Tokens(ids=t[0], labels=t[1], positions=t[2] if len(t) > 2 else None)
            self.put(pool, key, tokens, t.numel() * t.element_size())

    def host_tokens(self, pool: Pool) -> None:
        """The slots the driver stages micro-batches in, each with the event of its upload."""
        for key in pool.slot_ids():
            t = self.slot_array(pool)
            event = torch.cuda.Event() if self.s.pin else None
            fed = TokenSlot(ids=t[0], labels=t[1], positions=t[2] if len(t) > 2 else None,
                            uploaded=event)  # fmt: skip
            self.put(pool, key, fed, t.numel() * t.element_size())

    def losses(self, pool: Pool) -> None:
        """A step's loss per slot: views of one array, zeroed."""
        numel = math.prod(self.shaped(pool))
        whole = self.slot_array(replace(pool, shape=(pool.slots * numel,)))
        for i, key in enumerate(pool.slot_ids()):
            self.put(pool, key, whole[i * numel : (i + 1) * numel], numel * whole.element_size())

    def hidden(self, pool: Pool) -> None:
        for key in pool.slot_ids():
            t = self.slot_array(pool)
            self.put(pool, key, t, t.numel() * t.element_size())

    # -- weights and gradients ----------------------------------------------------------------
    def unit_slots(self, pool: Pool) -> None:
        numel = max(self.padded(u) for u in pool.units)
        for key in pool.slot_ids():
            self.put(pool, key, _gpu_unit(self.s, numel), 2 * numel * self.s.dtype.itemsize)

    def landing(self, pool: Pool) -> None:
        if pool.static:  # one slot holding every unit's gradient (ZeRO-offload)
            self.per_unit(pool, "landing")
            return
        self.host_ring(pool)

    def host_ring(self, pool: Pool) -> None:
        """A ring of host slots of the compute dtype, each the pool's largest unit: gradient
        landing, the weight-staging ring the casts fill."""
        numel = self.largest(pool)
        for key in pool.slot_ids():  # aligned: a held gradient goes to NVMe and back through it
            t = self.host(pool, numel, self.s.dtype, aligned=pool.role == R.GRAD_LANDING)
            self.put(pool, key, t, t.numel() * t.element_size())

    def per_unit(self, pool: Pool, prefix: str = "") -> None:
        """One tensor per unit of the pool (`prefix.{u}`): separate allocations when a slot
        holds one unit, views into one allocation when a slot holds them all."""
        s, prefix = self.s, prefix or UNIT_KEYS[pool.role]
        per_param = 2 if pool.role == R.MOMENTS else 1
        total = sum(self.numel(u) for u in pool.units)
        dtype = self.dtype(pool)
        flat = None
        if pool.slots < len(pool.units):
            on_device = pool.tier == Tier.GPU
            flat = _dev(s, total, dtype) if on_device else self.host(pool, total, dtype)
        offset = 0
        for unit in pool.units:
            n = per_param * self.numel(unit)
            t = flat[offset : offset + n] if flat is not None else self.host(pool, n, dtype)
            offset += n
            if pool.role == R.MOMENTS:
                t.zero_()
            self.put(pool, f"{prefix}.{unit}", t, t.numel() * t.element_size())

    def stream_slots(self, pool: Pool) -> None:
        """GPU staging of streamed units: master and moments per slot."""
        s, numel = self.s, self.largest(pool)
        for key in pool.slot_ids():
            state_bytes = numel * (4 + 2 * s.moments_dtype.itemsize)
            self.put(pool, key, _dev_opt_state(s, numel), state_bytes)

    def resident(self, pool: Pool) -> None:
        s = self.s
        for unit in pool.units:
            whole, numel = self.padded(unit), self.numel(unit)
            self.put(pool, f"gpu.{unit}", _gpu_unit(s, whole), 2 * whole * s.dtype.itemsize)
            state = _dev_opt_state(s, numel)
            self.put(pool, f"devopt.{unit}", state, numel * (4 + 2 * s.moments_dtype.itemsize))

    def device_weights(self, pool: Pool) -> None:
        """ZeRO-offload's whole-model weights, viewed per unit (paired with the gradients'
        views into `gpu.{u}` once both exist: `pair_device_units`)."""
        self.per_unit(pool, "zo_w")
        self.device_units = pool.units

    def device_grads(self, pool: Pool) -> None:
        """A gradient slot of ZeRO-offload (the reduce bucket, or the slot for gradients kept
        whole); each unit's gradient a view at its place in it (`Pool.offsets`)."""
        s, numel = self.s, pool.slot_bytes // 2  # the ledger's BF16 bytes
        slot = _dev(s, numel, s.dtype)
        self.put(pool, pool.name, slot, numel * s.dtype.itemsize)
        for unit, offset in zip(pool.units, pool.offsets, strict=True):
            self.out.items[f"zo_g.{unit}"] = slot[offset : offset + self.numel(unit)]

    def pair_device_units(self) -> None:
        for unit in self.device_units:
            w, g = self.out.items.pop(f"zo_w.{unit}"), self.out.items.pop(f"zo_g.{unit}")
            self.out.items[f"gpu.{unit}"] = GpuUnit(w=w, g=g)  # type: ignore[arg-type]

    def fp32_slots(self, pool: Pool) -> None:
        """A few FP32 numbers per slot, keyed by the slot (global clipping's norms and scale)."""
        numel = pool.slot_bytes // 4
        for key in pool.slot_ids():
            self.put(pool, key, self.host(pool, numel, torch.float32).zero_(), 4 * numel)

    def rollback(self, pool: Pool) -> None:
        """Per speculated unit, its master and moments as they were before the step's
        speculative update (`rollback.{u}`), written by that update."""
        s = self.s
        for unit in pool.units:
            numel = self.numel(unit)
            state = OptState(master=self.host(pool, numel, torch.float32),
                             m=self.host(pool, numel, s.moments_dtype),
                             v=self.host(pool, numel, s.moments_dtype))  # fmt: skip
            nbytes = numel * (4 + 2 * s.moments_dtype.itemsize)
            self.put(pool, f"{UNIT_KEYS[pool.role]}.{unit}", state, nbytes)

    def master_staging(self, pool: Pool) -> None:
        """Slots the FP32 master is read into from NVMe for a cast: a drive's stripe of the
        pool's largest unit each, aligned for O_DIRECT."""
        numel = stripe_numel(self.largest(pool), self.s.stripes)
        for key in pool.slot_ids():
            self.put(pool, key, self.host(pool, numel, torch.float32, aligned=True), numel * 4)

    def opt_staging(self, pool: Pool) -> None:
        """The host staging ring of NVMe optimizer-state stripes, as raw bytes that
        `nvme.stripe_state` views as master / m / v."""
        nbytes = stripe_bytes(self.s, self.largest(pool))
        for key in pool.slot_ids():
            self.put(pool, key, self.host(pool, nbytes, torch.uint8, aligned=True), nbytes)


ALLOCATORS: dict[PoolRole, Callable[[_Allocator, Pool], None]] = {
    R.ACCOUNTING: _Allocator.skip,
    R.WORKSPACE: _Allocator.skip,
    R.TAPE: _Allocator.skip,
    R.TOKENS: _Allocator.tokens,
    R.HOST_TOKENS: _Allocator.host_tokens,
    R.LOSSES: _Allocator.losses,
    R.HOST_LOSSES: _Allocator.losses,
    R.HIDDEN: _Allocator.hidden,
    R.HIDDEN_GRAD: _Allocator.hidden,
    R.HOST_HIDDEN: _Allocator.hidden,
    R.NVME_HIDDEN: _Allocator.skip,
    R.UNIT: _Allocator.unit_slots,
    R.RESIDENT: _Allocator.resident,
    R.STREAM_STATE: _Allocator.stream_slots,
    R.DEVICE_WEIGHTS: _Allocator.device_weights,
    R.DEVICE_GRADS: _Allocator.device_grads,
    R.GRAD_LANDING: _Allocator.landing,
    R.HOST_WEIGHTS: _Allocator.per_unit,
    R.WEIGHT_STAGING: _Allocator.host_ring,
    R.GRAD_ACCUM: _Allocator.per_unit,
    R.MASTER: _Allocator.per_unit,
    R.MOMENTS: _Allocator.per_unit,
    R.NVME_STATE: _Allocator.skip,
    R.NVME_GRADS: _Allocator.skip,
    R.OPT_STAGING: _Allocator.opt_staging,
    R.MASTER_STAGING: _Allocator.master_staging,
    R.GRAD_NORMS: _Allocator.fp32_slots,
    R.GRAD_SCALE: _Allocator.fp32_slots,
    R.ROLLBACK: _Allocator.rollback,
}


def stripe_numel(numel: int, stripes: int) -> int:
    """Elements of one NVMe stripe of a unit: the unit's elements split into `stripes` ranges."""
    return -(-numel // max(stripes, 1))


def stripe_bytes(s: Setup, numel: int) -> int:
    """Bytes of one stripe's state on NVMe: FP32 master (if there) + both moments."""
    per = (4 if "master" in s.opt_on_nvme else 0) + 2 * s.moments_dtype.itemsize
    return stripe_numel(numel, s.stripes) * per


def allocate(graph: Graph, setup: Setup) -> Buffers:
    """All pools of `graph`, in pool order. Units on the device start uninitialised: `state`
    fills them from the initial weights before the first op."""
    out = Buffers(host=HostMemory(setup.pin))
    alloc = _Allocator(setup, out)
    for pool in graph.pools:
        ALLOCATORS[pool.role](alloc, pool)
        for i, slot in enumerate(pool.slot_ids()):
            out.roles[slot], out.index[slot] = pool.role, i
    alloc.pair_device_units()
    out.host.wait()
    for pool in graph.pools:
        if pool.name in out.allocated:
            log.debug(
                "pool %s: planned %d B, allocated %d B",
                pool.name,
                pool.bytes,
                out.allocated[pool.name],
            )
    return out
