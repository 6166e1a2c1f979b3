"""Building a run: buffers, environment; and reading memory back.

Everything a run touches is created here, before the first op: the buffers of every pool,
the static token and loss buffers, RoPE tables (for packed documents, each micro-batch's are
built by its embedding's forward), the NVMe files. After this the lanes allocate
only through torch's caching allocators (autograd's transients, the LCE workspace), which reach
their steady size on step 1.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from executor import knobs as knobs_mod
from executor import layers, state
from executor.adam import AdamWConfig
from executor.buffers import Buffers, Setup, allocate, stripe_bytes
from executor.env import Env
from executor.layout import Shard, UnitLayout, shard_of, unit_layouts
from executor.nvme import NvmeStore, StripeFormat, backend_for
from executor.phases import Phases
from executor.ranks import Ranks
from executor.staging import TokenSlot, TokenStaging
from slide_ir.ir.drives import NvmeDirs, act_slots_by_drive, grad_drive
from slide_ir.ir.graph import TOKEN_FIELDS, Graph, GraphInfo, PoolRole, Tier, UnitPlacement
from slide_ir.ir.trace import MemorySample
from slide_ir.program import Program


@dataclass(kw_only=True)
class Built:
    """A Program's buffers allocated and its state loaded: what its lanes run on."""

    program: Program
    env: Env
    setup: Setup

    def memory_at_start(self, t0: float) -> list[MemorySample]:
        tiers = self.program.graph.pools
        out: dict[str, int] = {}
        for pool in tiers:
            out[str(pool.tier)] = out.get(str(pool.tier), 0) + self.env.buffers.allocated.get(
                pool.name, 0
            )
        return [MemorySample(time=0.0, tier=t, bytes=b) for t, b in sorted(out.items())]

    def memory_sample(self, t: float) -> list[MemorySample]:
        """GPU peak allocated since the last sample (CUDA) and host RSS, at the end of a step."""
        out = []
        if self.env.cuda:
            peak = torch.cuda.max_memory_allocated(self.env.device)
            torch.cuda.reset_peak_memory_stats(self.env.device)
            out.append(MemorySample(time=t, tier="gpu", bytes=peak))
        rss = _rss_bytes()
        if rss:
            pinned = sum(
                self.env.buffers.allocated.get(p.name, 0)
                for p in self.program.graph.pools
                if p.tier == Tier.PINNED
            )
            out.append(MemorySample(time=t, tier="pinned", bytes=pinned))
            out.append(MemorySample(time=t, tier="cpu", bytes=max(rss - pinned, 0)))
        return out

    def memory_now(self) -> dict[str, int]:
        """Host RSS and, on CUDA, the device memory allocated and reserved right now: what a
        long run's metrics follow to show that nothing grows. Also the caching allocator's
        retries so far: each one freed its cached blocks and synchronised the device, which a
        GPU filled to its ledger pays for in step time. And the bytes of torch's pinned host
        pool (the engine's pinned buffers and anything else pinned through it), the part of
        RSS a CUDA run could grow without malloc."""
        out = {"host_rss_bytes": _rss_bytes()}
        if self.env.cuda:
            out["gpu_allocated_bytes"] = torch.cuda.memory_allocated(self.env.device)
            out["gpu_reserved_bytes"] = torch.cuda.memory_reserved(self.env.device)
            stats = torch.cuda.memory_stats(self.env.device)
            out["gpu_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
            pinned = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
            out["host_pinned_pool_bytes"] = int(pinned)
        return out

    def extract(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return state.extract(self.env)

    def state_views(self) -> tuple[state.StateView, state.StateView]:
        """The state a unit at a time, while the engine is up (checkpoints)."""
        return state.state_views(self.env)

    def close(self) -> None:
        """Release what outlives garbage collection: pinned registrations, NVMe files."""
        if self.env.cuda:
            torch.cuda.synchronize(self.env.device)
        self.env.buffers.host.close()
        if self.env.nvme is not None:
            self.env.nvme.close()

    def meta(self, knobs: knobs_mod.Knobs) -> dict[str, Any]:
        env = self.env
        return {
            "engine": "executor",
            "device": torch.cuda.get_device_name(env.device) if env.cuda else "cpu",
            "dtype": str(env.dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "intra_op_threads": torch.get_num_threads(),
            "knobs": {k: getattr(knobs, k) for k in knobs.__slots__},
            "allocated_bytes": dict(env.buffers.allocated),
            "resident": _units_placed(self.program.graph, UnitPlacement.RESIDENT),
            "streamed": _units_placed(self.program.graph, UnitPlacement.STREAMED),
            "clip": _clip_mode(self.program.graph.info),
            **({"placement": dict(self.program.placement)} if self.program.placement else {}),
        }


def _clip_mode(info: GraphInfo) -> str:
    return "global" if info.global_clip_norm else "per-unit" if info.clip_norm else "none"


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _units_placed(graph: Graph, where: UnitPlacement) -> list[int]:
    return [u for u, placed in enumerate(graph.info.placement) if placed == where]


def _nvme(
    p: Program, s: Setup, directories: NvmeDirs, act_bytes: int, cuda: bool, ranks: Ranks | None
) -> tuple[NvmeStore | None, StripeFormat | None]:
    optimizer = p.graph.info.optimizer
    on_disk = {pool.role for pool in p.graph.pools} & {
        PoolRole.NVME_STATE, PoolRole.NVME_HIDDEN, PoolRole.NVME_GRADS}  # fmt: skip
    if not on_disk:
        return None, None
    drives = p.drives
    fmt = StripeFormat(
        drives=drives, master_on_nvme=optimizer == "nvme", moments_dtype=s.moments_dtype
    )
    sizes = {}
    if optimizer != "cpu":
        on_nvme = [u for pool in p.graph.pools if pool.role == PoolRole.NVME_STATE
                   for u in pool.units]  # fmt: skip
        sizes = {u: stripe_bytes(s, s.shards[u].numel) for u in sorted(on_nvme)}
    store = NvmeStore(
        directories,
        drives,
        sizes,
        act_slots=act_slots_by_drive(p.graph, drives),
        act_bytes=act_bytes,
        grad_sizes=_held_grads(p, s, drives),
        backend=backend_for(cuda),
        tag=f".rank{ranks.rank}" if ranks is not None else "",
    )
    return store, fmt


def _held_grads(p: Program, s: Setup, drives: int) -> dict[int, tuple[int, int]]:
    """unit -> (its drive, bytes) for each gradient global clipping holds on NVMe."""
    held = [u for pool in p.graph.pools if pool.role == PoolRole.NVME_GRADS for u in pool.units]
    size = s.dtype.itemsize
    return {u: (grad_drive(u, drives), s.shards[u].numel * size) for u in sorted(held)}


def shards(layouts: dict[int, UnitLayout], ranks: Ranks | None) -> dict[int, Shard]:
    """What this rank updates of each unit: all of it on one rank."""
    return {
        u: shard_of(lay, *(ranks.shard(lay.numel) if ranks is not None else (0, lay.numel)))
        for u, lay in layouts.items()
    }


def _setup(p: Program, device: torch.device, dtype: torch.dtype, ranks: Ranks | None) -> Setup:
    info, spec = p.graph.info, p.model
    opt_on_nvme = {"cpu": (), "nvme": ("master", "moments"), "nvme-moments": ("moments",)}
    layouts = unit_layouts(spec)
    return Setup(
        spec=spec,
        layouts=layouts,
        shards=shards(layouts, ranks),
        nproc=ranks.nproc if ranks is not None else 1,
        device=device,
        dtype=dtype,
        moments_dtype=torch.float32 if info.moments_dtype == "fp32" else torch.bfloat16,
        pin=device.type == "cuda",
        stripes=p.drives if info.optimizer != "cpu" else 0,
        opt_on_nvme=opt_on_nvme[info.optimizer],
    )


def _slot_shape(graph: Graph, role: PoolRole) -> tuple[int, ...]:
    """The slot shape of the graph's pools of `role` (every such pool has the one)."""
    return next(pool.shape for pool in graph.pools if pool.role == role)


def _staging(buffers: Buffers) -> TokenStaging:
    """The host token pool's slots, the driver's to stage micro-batches in."""
    return TokenStaging({k: v for k, v in buffers.items.items() if isinstance(v, TokenSlot)})


def build(
    p: Program,
    *,
    device: torch.device,
    dtype: torch.dtype,
    optim: AdamWConfig,
    step_offset: int,
    total_steps: int,
    nvme_dir: NvmeDirs,
    initial_state: Mapping[str, torch.Tensor],
    initial_optim_state: Mapping[str, torch.Tensor] | None,
    phases: Phases | None = None,
    ranks: Ranks | None = None,
) -> Built:
    """The batches are packed documents (with positions) where the Program's token slots hold
    positions (`TOKEN_FIELDS`)."""
    phases = phases or Phases()
    with phases("engine check"):
        s = _setup(p, device, dtype, ranks)
        state.check_names(s.layouts, initial_state, p.model.tied_embeddings)
    with phases("buffers"):
        buffers: Buffers = allocate(p.graph, s)
    info = p.graph.info
    act_bytes = math.prod(_slot_shape(p.graph, PoolRole.HIDDEN)) * dtype.itemsize
    documents = _slot_shape(p.graph, PoolRole.TOKENS)[0] == len(TOKEN_FIELDS)
    store, fmt = _nvme(p, s, nvme_dir, act_bytes, device.type == "cuda", ranks)
    env = Env(
        spec=p.model,
        layouts=s.layouts,
        shards=s.shards,
        buffers=buffers,
        # packed documents: each micro-batch's own, built by its embedding's forward
        rope=None if documents else layers.make_rope(p.model, info.seq, device, dtype),
        device=device,
        dtype=dtype,
        cuda=device.type == "cuda",
        optim=optim,
        step_offset=step_offset,
        total_steps=total_steps,
        lce_chunk=info.lce_chunk or None,
        staging=_staging(buffers),
        step_t=torch.zeros((), dtype=torch.float32, device=device),
        abort=threading.Event(),
        act_bytes=act_bytes,
        moments_bf16=s.moments_dtype == torch.bfloat16,
        clip_norm=info.clip_norm or None,
        global_clip_norm=info.global_clip_norm,
        nvme=store,
        stripes=fmt,
        ranks=ranks,
    )
    try:
        with phases("state"):
            state.load(env, initial_state, initial_optim_state)
    except BaseException:
        if store is not None:  # nothing built to close yet: remove the NVMe files here
            store.close()
        raise
    return Built(program=p, env=env, setup=s)
