"""Every buffer of a run, allocated once from the Graph's pools before the first op.

Keys are the graph's slot ids (`gpu_units.1`, `pinned_acts.3`, ...) for slotted pools, and
per-unit names for static pools: `gpu.{u}` (a unit living on the device: resident, ZeRO-offload,
gpu-only), `devopt.{u}` (its device-side FP32 master + moments), `bf16.{u}` (pinned compute-dtype
copy the next upload reads), `master.{u}`, `moments.{u}`, `accum.{u}` (host FP32; pinned for
streamed units), `landing.{u}` (ZeRO-offload's static gradient landing). A streamed unit's GPU
staging slot `gpu_opt_<group>.k` is an `OptState` sized to the group, with its FP32 gradient
scratch beside it under `gpu_opt_<group>.k.grad`. Pools sized by the ledger in BF16 bytes are allocated
at the compute dtype (FP32 in CPU tests: twice the bytes). The GPU workspace and LCE pools are
not pre-allocated by hand: autograd and the LCE kernel take them from torch's caching allocator
on step 1 and reuse the same segments afterwards (the GPU test checks the count stays flat).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from executor.layout import UnitLayout
from executor.nvme_io import aligned_empty
from slide_ir.graph import Graph, Pool, Tier
from slide_ir.model import ModelSpec
from slide_ir.zero_offload import BUCKET_POOL, WHOLE_POOL, GradBucket

log = logging.getLogger("executor.buffers")

# not buffers of the run: the runtime, workspaces torch allocates, the final state's host copy
NOT_ALLOCATED = ("gpu_context", "host_runtime", "gpu_workspace", "gpu_lce", "host_handback",
                 "gpu_tokens",  # the executor keeps its own token buffers (issue 16: to move)
                 # DeepSpeed's accumulation staging, which ZeRO-offload's ledger counts: unused here
                 "gpu_offload_staging", "host_offload_staging")
# host pools the NVMe lanes read and write with O_DIRECT: allocated 4096-byte aligned
NVME_STAGING = ("opt_staging_", "pinned_act_staging")


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
class Placement:
    """Where units live. `resident`: updated on the device (sliding's resident units, every unit
    of gpu-only); the rest keep their state on the host and slide, `streamed` ones visiting the
    device for their update."""

    schedule: str
    resident: frozenset[int]
    units: tuple[int, ...]
    streamed: frozenset[int] = frozenset()

    @property
    def host_updated(self) -> tuple[int, ...]:
        """Units whose FP32 master and moments live on the host (RAM or NVMe)."""
        return tuple(u for u in self.units if u not in self.resident)

    @property
    def cpu_updated(self) -> tuple[int, ...]:
        """Units the host AdamW updates."""
        return tuple(u for u in self.host_updated if u not in self.streamed)

    def is_sliding(self, unit: int) -> bool:
        return self.schedule == "sliding" and unit not in self.resident

    def grads_persist(self, unit: int) -> bool:
        """The unit's device gradients outlive a micro-batch (ZeRO-offload's go down in
        buckets and their memory is reused)."""
        return self.schedule != "zero-offload" and not self.is_sliding(unit)


@dataclass(frozen=True, kw_only=True, slots=True)
class Setup:
    """What allocation needs to know besides the graph."""

    spec: ModelSpec
    layouts: dict[int, UnitLayout]
    placement: Placement
    device: torch.device
    dtype: torch.dtype  # compute dtype of weights, grads, activations
    moments_dtype: torch.dtype
    hidden_shape: tuple[int, int, int]  # (B, S, H)
    pin: bool  # pinned host memory (CUDA only)
    stripes: int  # NVMe drives the optimizer state is striped over (0: none)
    opt_on_nvme: tuple[str, ...] = ()  # which of "master", "moments" live on NVMe
    grad_buckets: tuple[GradBucket, ...] = ()  # ZeRO-offload: where each unit's gradient sits


def _host_empty(numel: int, dtype: torch.dtype, aligned: bool) -> torch.Tensor:
    return aligned_empty(numel, dtype) if aligned else torch.empty(numel, dtype=dtype)


class HostMemory:
    """Host allocations. Pinned ones are ordinary allocations registered with CUDA
    (cudaHostRegister) at their exact size: torch's pinned allocator rounds every block up to a
    power of two, which could take up to twice the pinned memory the ledger plans."""

    def __init__(self, pin: bool) -> None:
        self.pin, self.register = pin, True
        self.registered: list[torch.Tensor] = []

    def empty(self, numel: int, dtype: torch.dtype, aligned: bool = False) -> torch.Tensor:
        """`aligned`: the first byte on a 4096-byte boundary, for O_DIRECT (see `nvme_io`)."""
        if not (self.pin and numel):
            return _host_empty(numel, dtype, aligned)
        if self.register:
            t = _host_empty(numel, dtype, aligned)
            err = int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), numel * dtype.itemsize, 0))
            if not err:
                self.registered.append(t)
                return t
            self.register = False  # e.g. a sandboxed driver without host registration
            log.warning("cudaHostRegister failed (error %d): pinned pools use torch's pinned "
                        "allocator, which rounds each up to a power of two", err)  # fmt: skip
        return torch.empty(numel, dtype=dtype, pin_memory=True)

    def close(self) -> None:
        """Unregister everything (the tensors must not be used for copies afterwards)."""
        for t in self.registered:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        self.registered.clear()


@dataclass(kw_only=True)
class Buffers:
    host: HostMemory
    items: dict[str, object] = field(default_factory=dict)
    allocated: dict[str, int] = field(default_factory=dict)  # pool -> bytes actually allocated

    def __getitem__(self, key: str):  # type: ignore[no-untyped-def]
        return self.items[key]

    def tensor(self, key: str) -> torch.Tensor:
        item = self.items[key]
        assert isinstance(item, torch.Tensor), key
        return item

    def gpu_unit(self, key: str) -> GpuUnit:
        item = self.items[key]
        assert isinstance(item, GpuUnit), key
        return item


def group_units(spec: ModelSpec, units: tuple[int, ...] | list[int], group: str) -> list[int]:
    """Members of a pool group (embed / layers / head) among `units`, ascending: the order in
    which the ledger gave static pools their slots."""
    n = spec.num_layers
    member = {"embed": lambda u: u == 0, "layers": lambda u: 1 <= u <= n, "head": lambda u: u > n}
    return sorted(u for u in units if member[group](u))


def _dev(s: Setup, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype, device=s.device)


def _gpu_unit(s: Setup, numel: int) -> GpuUnit:
    return GpuUnit(w=_dev(s, numel, s.dtype), g=_dev(s, numel, s.dtype))


def _dev_opt_state(s: Setup, numel: int) -> OptState:
    moments = _dev(s, 2 * numel, s.moments_dtype).zero_()
    return OptState(master=_dev(s, numel, torch.float32), m=moments[:numel], v=moments[numel:])


class _Allocator:
    """One method per pool family; `allocate` dispatches on the pool's name. Host pools on a
    pinned tier are pinned (on CUDA); pageable ones (master, moments, accumulators) are not."""

    def __init__(self, s: Setup, out: Buffers) -> None:
        self.s, self.out = s, out

    def host(self, pool: Pool, numel: int, dtype: torch.dtype) -> torch.Tensor:
        aligned = pool.name.startswith(NVME_STAGING)
        if pool.tier == Tier.PINNED:  # torch's pinned fallback is page-aligned already
            return self.out.host.empty(numel, dtype, aligned)
        return _host_empty(numel, dtype, aligned)

    def put(self, pool: Pool, key: str, item: object, nbytes: int) -> None:
        self.out.items[key] = item
        self.out.allocated[pool.name] = self.out.allocated.get(pool.name, 0) + nbytes

    def numel(self, unit: int) -> int:
        return self.s.layouts[unit].numel

    def group_numel(self, group: str) -> int:
        """Elements of one unit of a pool group (embed / layers / head)."""
        return self.numel({"embed": 0, "layers": 1, "head": self.s.spec.num_layers + 1}[group])

    def group(self, pool: Pool, units: tuple[int, ...] | list[int]) -> list[int]:
        members = group_units(self.s.spec, units, pool.name.rpartition("_")[2])
        if len(members) != pool.slots:
            raise RuntimeError(
                f"pool {pool.name}: {pool.slots} slots but {len(members)} units {members}"
            )
        return members

    # -- activations ------------------------------------------------------------------------
    def hidden(self, pool: Pool, on_device: bool) -> None:
        b, seq, h = self.s.hidden_shape
        size = self.s.dtype.itemsize * b * seq * h
        for key in pool.slot_ids():
            if on_device:
                t = torch.empty((b, seq, h), dtype=self.s.dtype, device=self.s.device)
            else:
                t = self.host(pool, b * seq * h, self.s.dtype).view(b, seq, h)
            self.put(pool, key, t, size)

    # -- weights and gradients ----------------------------------------------------------------
    def unit_slots(self, pool: Pool, group: str) -> None:
        numel = self.group_numel(group)
        for key in pool.slot_ids():
            self.put(pool, key, _gpu_unit(self.s, numel), 2 * numel * self.s.dtype.itemsize)

    def landing_slots(self, pool: Pool, group: str) -> None:
        numel = self.group_numel(group)
        for key in pool.slot_ids():
            t = self.host(pool, numel, self.s.dtype)
            self.put(pool, key, t, t.numel() * t.element_size())

    def per_unit(
        self,
        pool: Pool,
        prefix: str,
        dtype: torch.dtype,
        per_param: int = 1,
        members: tuple[int, ...] | None = None,
    ) -> None:
        """One tensor per unit of the pool's group among `members` (default: host-updated)."""
        s = self.s
        for unit in self.group(pool, s.placement.host_updated if members is None else members):
            t = self.host(pool, per_param * self.numel(unit), dtype)
            if prefix == "moments":
                t.zero_()
            self.put(pool, f"{prefix}.{unit}", t, t.numel() * t.element_size())

    def state_owners(self, pool: Pool) -> tuple[int, ...]:
        """Host optimizer state: pinned pools hold the streamed units', pageable ones the rest."""
        placement = self.s.placement
        if pool.tier == Tier.PINNED:
            return tuple(sorted(placement.streamed))
        return placement.cpu_updated

    def stream_slots(self, pool: Pool) -> None:
        """GPU staging of streamed units: master, moments and FP32 gradient scratch per slot."""
        s = self.s
        numel = self.group_numel(pool.name.rpartition("_")[2])
        for key in pool.slot_ids():
            state_bytes = numel * (4 + 2 * s.moments_dtype.itemsize)
            self.put(pool, key, _dev_opt_state(s, numel), state_bytes)
            self.put(pool, f"{key}.grad", _dev(s, numel, torch.float32), 4 * numel)

    def resident(self, pool: Pool, units: list[int]) -> None:
        s = self.s
        for unit in units:
            numel = self.numel(unit)
            self.put(pool, f"gpu.{unit}", _gpu_unit(s, numel), 2 * numel * s.dtype.itemsize)
            state = _dev_opt_state(s, numel)
            self.put(pool, f"devopt.{unit}", state, numel * (4 + 2 * s.moments_dtype.itemsize))

    def flat_model(self, pool: Pool, prefix: str, on_device: bool, dtype: torch.dtype) -> None:
        """ZeRO-offload's whole-model buffers, viewed per unit."""
        s = self.s
        total = sum(self.numel(u) for u in s.placement.units)
        big = _dev(s, total, dtype) if on_device else self.host(pool, total, dtype)
        self.out.allocated[pool.name] = total * dtype.itemsize
        offset = 0
        for unit in s.placement.units:
            n = self.numel(unit)
            self.out.items[f"{prefix}.{unit}"] = big[offset : offset + n]
            offset += n

    def allocate(self, pool: Pool) -> None:
        s, name = self.s, pool.name
        if name in NOT_ALLOCATED:
            return
        if name in ("gpu_hidden_grads", "gpu_acts"):
            self.hidden(pool, on_device=True)
        elif name in ("pinned_acts", "pinned_act_staging"):
            self.hidden(pool, on_device=False)
        elif name in ("gpu_units", "gpu_embed", "gpu_head"):
            self.unit_slots(pool, name.partition("_")[2].replace("units", "layers"))
        elif name.startswith("pinned_grads_"):
            self.landing_slots(pool, name.rpartition("_")[2])
        elif name.startswith("pinned_bf16_"):
            self.per_unit(pool, "bf16", s.dtype)
        elif name.startswith("grad_accum_"):
            self.per_unit(pool, "accum", torch.float32)
        elif name.startswith(("master_", "pinned_master_")):
            self.per_unit(pool, "master", torch.float32, members=self.state_owners(pool))
        elif name.startswith(("moments_", "pinned_moments_")):
            self.per_unit(
                pool, "moments", s.moments_dtype, per_param=2, members=self.state_owners(pool)
            )
        elif name.startswith("gpu_opt_"):
            self.stream_slots(pool)
        elif name.startswith("gpu_resident_"):
            self.resident(pool, self.group(pool, sorted(s.placement.resident)))
        elif name == "gpu_state":
            self.resident(pool, list(s.placement.units))
        elif name in ("gpu_params", BUCKET_POOL, WHOLE_POOL, "pinned_grads", "pinned_bf16"):
            self.zero_offload(pool)
        elif name.startswith(("nvme_", "opt_staging_")):
            self.nvme(pool)
        else:
            raise RuntimeError(f"the executor has no allocator for pool {name!r}")

    def zero_offload(self, pool: Pool) -> None:
        """Whole-model weights (device), FP32 gradient landing and BF16 copy (pinned), viewed
        per unit; the reduce bucket and the slot for gradients kept whole (device), each unit's
        gradient a view at its place in them (`slide_ir.zero_offload.grad_buckets`)."""
        s, name = self.s, pool.name
        if name in (BUCKET_POOL, WHOLE_POOL):
            numel = pool.slot_bytes // 2  # the ledger's BF16 bytes
            self.put(pool, name, _dev(s, numel, s.dtype), numel * s.dtype.itemsize)
        else:
            prefix = {"gpu_params": "zo_w", "pinned_grads": "landing"}.get(name, "bf16")
            dtype = torch.float32 if name == "pinned_grads" else s.dtype
            self.flat_model(pool, prefix, name.startswith("gpu_"), dtype)
        if name == BUCKET_POOL:  # pools come weights, whole slot, bucket: pair them per unit
            for b in s.grad_buckets:
                slot = self.out.items[b.pool]
                for unit, offset in zip(b.units, b.offsets, strict=True):
                    g = slot[offset : offset + self.numel(unit)]  # type: ignore[index]
                    w = self.out.items.pop(f"zo_w.{unit}")
                    self.out.items[f"gpu.{unit}"] = GpuUnit(w=w, g=g)  # type: ignore[arg-type]

    def nvme(self, pool: Pool) -> None:
        """NVMe regions are files (see `nvme`); only the host staging ring is allocated here,
        as raw bytes that `nvme.stripe_state` views as master / m / v."""
        if not pool.name.startswith("opt_staging_"):
            return
        nbytes = stripe_bytes(self.s, self.group_numel(pool.name.rpartition("_")[2]))
        for key in pool.slot_ids():
            self.put(pool, key, self.host(pool, nbytes, torch.uint8), nbytes)


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
        alloc.allocate(pool)
    for pool in graph.pools:
        if pool.name in out.allocated:
            log.debug(
                "pool %s: planned %d B, allocated %d B",
                pool.name,
                pool.bytes,
                out.allocated[pool.name],
            )
    return out
