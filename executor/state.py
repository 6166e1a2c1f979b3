"""Weights and optimizer state in and out of a run, as Hugging Face-named FP32 tensors.

In: the initial state dict (transformers names: `model.layers.3.self_attn.q_proj.weight`, ...)
and, to resume, the Adam moments (`<name>.exp_avg`, `<name>.exp_avg_sq`). Each unit's tensors
are packed into its flat layout and put where the plan keeps the unit: FP32 master + moments
in RAM / on NVMe / on the device, plus the compute-dtype copy the first upload (or the first
forward, for units living on the device) reads. Out: the same names, read back from there.

Start-up cost: a state that can write a tensor straight into a buffer (`fill(name, out)`, as
`RandomInit` and `SafetensorsWeights` do) is written into the unit's host master, with no
temporary; shapes are checked from `shape_of(name)` without making the tensors; fresh moments
are left as allocated (zero); units load in parallel threads (the random init of one tensor is
one thread's work).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import torch

from executor.adam import Part
from executor.buffers import OptState
from executor.env import Env
from executor.layout import UnitLayout
from executor.nvme_io import aligned_empty

EXP_AVG, EXP_AVG_SQ = ".exp_avg", ".exp_avg_sq"
# the state (weights, moments) read from the running engine: valid during the callback only
ReadState = Callable[[], tuple[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]]]


class StateDictError(ValueError):
    """Missing, unexpected or mis-shaped tensors in an initial state; the message names them."""


def check_names(
    layouts: Mapping[int, UnitLayout], state: Mapping[str, torch.Tensor], tied: bool
) -> None:
    want = {e.name: e.shape for lay in layouts.values() for e in lay.hf}
    have = set(state)
    if tied:
        have.discard("lm_head.weight")  # a tied head saved anyway: it is the embedding
    missing, extra = sorted(set(want) - have), sorted(have - set(want))
    shapes = {n: _shape(state, n) for n in sorted(have & set(want))}
    bad = [f"{n} {shape} != {want[n]}" for n, shape in shapes.items() if shape != want[n]]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if extra:
        problems.append(f"unexpected {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    if bad:
        problems.append(f"wrong shape: {'; '.join(bad[:5])}")
    if problems:
        raise StateDictError("initial state does not match the model: " + "; ".join(problems))


def _shape(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    shape_of = getattr(state, "shape_of", None)
    return tuple(shape_of(name) if shape_of else state[name].shape)


def pack(
    layout: UnitLayout,
    named: Mapping[str, torch.Tensor],
    suffix: str = "",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """A unit's flat FP32 tensor from HF-named tensors (`suffix` picks moments: `.exp_avg`),
    written into `out` when given."""
    flat = torch.empty(layout.numel, dtype=torch.float32) if out is None else out
    fill = getattr(named, "fill", None)
    for name, view in layout.hf_views(flat).items():
        if fill is not None:
            fill(name + suffix, view)
        else:
            view.copy_(named[name + suffix])
    return flat


def unpack(layout: UnitLayout, flat: torch.Tensor, suffix: str = "") -> dict[str, torch.Tensor]:
    """Views by HF name into `flat` (brought to the CPU in FP32 if it is not there yet). No copy:
    a finished run hands its buffers over; copying 12 bytes per parameter again at the end is
    what would overflow host RAM for an 8B model on a 128 GiB host."""
    flat = flat.detach().to("cpu", torch.float32)
    return {name + suffix: view for name, view in layout.hf_views(flat).items()}


def _moments(
    layout: UnitLayout, optim: Mapping[str, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if optim is None:
        zero = torch.zeros(layout.numel)
        return zero, zero
    return pack(layout, optim, EXP_AVG), pack(layout, optim, EXP_AVG_SQ)


def load(
    env: Env, state: Mapping[str, torch.Tensor], optim: Mapping[str, torch.Tensor] | None
) -> None:
    """Put the initial weights (and moments) into every unit's homes. Runs before the lanes;
    units in parallel, but one at a time where NVMe files are written."""
    workers = 1 if env.nvme is not None else min(LOAD_THREADS, os.cpu_count() or 1)
    units = sorted(env.layouts, key=lambda u: -env.layouts[u].numel)  # the largest first
    with ThreadPoolExecutor(workers, thread_name_prefix="slide-load") as pool:
        for done in [pool.submit(_load_unit, env, u, state, optim) for u in units]:
            done.result()
    if env.cuda:
        torch.cuda.synchronize(env.device)


LOAD_THREADS = 8  # random init is one thread per tensor; copies are memory-bound beyond ~8


def _load_unit(
    env: Env, unit: int, state: Mapping[str, torch.Tensor], optim: Mapping[str, torch.Tensor] | None
) -> None:
    """A unit's state into its homes: the rank's shard of the FP32 master and moments, the
    weights whole where the GPU keeps them (resident units)."""
    layout, shard, items = env.layouts[unit], env.shards[unit], env.buffers.items
    mine = slice(shard.start, shard.end)
    if f"devopt.{unit}" in items:  # resident / gpu-only: everything on the device
        master = pack(layout, state)
        dev = env.buffers[f"devopt.{unit}"]
        assert isinstance(dev, OptState)
        dev.master.copy_(master[mine])
        if optim is not None:  # fresh moments: zero as allocated, nothing to send
            m, v = _moments(layout, optim)
            dev.m.copy_(m[mine])
            dev.v.copy_(v[mine])
        whole = shard.numel == layout.numel  # the weights from the device copy, cast there
        env.buffers.gpu_unit(f"gpu.{unit}").w[: layout.numel].copy_(dev.master if whole else master)
        return
    home = items.get(f"master.{unit}")  # None: the master lives on NVMe
    whole = shard.numel == layout.numel  # one rank: pack straight into the homes
    if whole:
        master = pack(layout, state, out=home if isinstance(home, torch.Tensor) else None)
    else:
        master = pack(layout, state)[mine]
        if isinstance(home, torch.Tensor):
            home.copy_(master)
    n = shard.numel
    if optim is not None and f"moments.{unit}" in items:  # fresh moments: zero as allocated
        moments = env.buffers.tensor(f"moments.{unit}")
        for part, suffix in ((moments[:n], EXP_AVG), (moments[n:], EXP_AVG_SQ)):
            if whole:
                pack(layout, optim, suffix, out=part)
            else:
                part.copy_(pack(layout, optim, suffix)[mine])
    if env.nvme is not None:
        _write_stripes(env, unit, master, *(t[mine] for t in _moments(layout, optim)))
    if f"bf16.{unit}" in items:  # a unit whose uploads cast has no pinned copy
        env.buffers.tensor(f"bf16.{unit}")[:n].copy_(master)
    if f"gpu.{unit}" in items:  # ZeRO-offload: the whole model starts on the device
        env.buffers.gpu_unit(f"gpu.{unit}").w.copy_(master)


def _stripe_parts(env: Env, unit: int) -> list[tuple[torch.Tensor, Part]]:
    """A fresh staging-like buffer and its typed views, for every stripe of `unit`."""
    assert env.stripes is not None
    numel, out = env.shards[unit].numel, []
    master = env.buffers.items.get(f"master.{unit}")
    for k in range(env.stripes.drives):
        buf = aligned_empty(env.stripes.stripe_bytes(numel), torch.uint8)  # O_DIRECT's DMA
        out.append((buf, env.stripes.part(buf, numel, k, master)))  # type: ignore[arg-type]
    return out


def _write_stripes(
    env: Env, unit: int, master: torch.Tensor, m: torch.Tensor, v: torch.Tensor
) -> None:
    assert env.nvme is not None and env.stripes is not None
    if unit not in env.nvme.offset:
        return
    for k, (buf, part) in enumerate(_stripe_parts(env, unit)):
        lo, hi = part.lo, part.hi
        if env.stripes.master_on_nvme:
            part.state.master.copy_(master[lo:hi])
        part.state.m.copy_(m[lo:hi])
        part.state.v.copy_(v[lo:hi])
        env.nvme.write(k, env.nvme.offset[unit], buf)


def _host_state(env: Env, unit: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(master, m, v) of a host-updated unit's shard as flat FP32 tensors, from RAM or NVMe."""
    numel = env.shards[unit].numel
    master = env.buffers.items.get(f"master.{unit}")
    if env.nvme is None or unit not in env.nvme.offset:
        moments = env.buffers.tensor(f"moments.{unit}").float()
        assert isinstance(master, torch.Tensor)
        return master, moments[:numel], moments[numel:]
    out = [torch.empty(numel) for _ in range(3)]
    for k, (buf, part) in enumerate(_stripe_parts(env, unit)):
        env.nvme.read(k, env.nvme.offset[unit], buf)
        for t, src in zip(out, (part.state.master, part.state.m, part.state.v), strict=True):
            t[part.lo : part.hi].copy_(src)
    return out[0], out[1], out[2]


def extract(env: Env) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(weights, moments), HF names, FP32 on the CPU. Call after the lanes have stopped. Data
    parallel: every rank calls it; rank 0 gets the state, the others empty dicts."""
    weights: dict[str, torch.Tensor] = {}
    moments: dict[str, torch.Tensor] = {}

    def take(read: ReadState) -> None:
        for unit in env.layouts:
            unit_weights, unit_moments = _read_unit(env, unit)
            weights.update(unit_weights)
            moments.update(unit_moments)

    read_on_main(env, take)
    return weights, moments


def read_on_main(env: Env, use: Callable[[ReadState], None]) -> None:
    """`use(read_state)` where the state is read: on rank 0 of a data-parallel run, while the
    other ranks send it their shards of each unit it asks for (a broadcast of the unit, then a
    gather), until it says it is done (unit -1); on one process, just there."""
    ranks = env.ranks
    if ranks is None:
        use(lambda: state_views(env))
        return
    if not ranks.is_main:
        while (unit := ranks.broadcast_int(-1)) >= 0:
            _unit_state(env, unit)
        return
    try:
        use(lambda: state_views(env))
    finally:
        ranks.broadcast_int(-1)


def _read_unit(env: Env, unit: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Rank 0 (or the one process) reads `unit`: the other ranks are told which, and send their
    shards (`read_on_main`)."""
    if env.ranks is not None:
        env.ranks.broadcast_int(unit)
    return _unit_state(env, unit)


def _unit_state(env: Env, unit: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The unit's weights and moments by HF name (whole: data parallel gathers the shards)."""
    layout = env.layouts[unit]
    dev = env.buffers.items.get(f"devopt.{unit}")
    if isinstance(dev, OptState):
        master, m, v = dev.master, dev.m, dev.v
    else:
        master, m, v = _host_state(env, unit)
    if env.ranks is not None:
        master, m, v = (env.ranks.gather_parts(t.detach().to("cpu", torch.float32), layout.numel)
                        for t in (master, m, v))  # fmt: skip
    moments = unpack(layout, m, EXP_AVG) | unpack(layout, v, EXP_AVG_SQ)
    return unpack(layout, master), moments


def state_views(env: Env) -> tuple[StateView, StateView]:
    """(weights, moments) as `extract` names them, read a unit at a time (see `StateView`)."""
    cache = _OneUnit(env)
    weights, moments = {}, {}
    for unit, layout in env.layouts.items():
        for e in layout.hf:
            weights[e.name] = (unit, e.shape)
            moments[e.name + EXP_AVG] = moments[e.name + EXP_AVG_SQ] = (unit, e.shape)
    return StateView(cache, weights), StateView(cache, moments)


class StateView(Mapping[str, torch.Tensor]):
    """A running engine's state by HF name, FP32 on the CPU, read from its homes (RAM, NVMe, the
    GPU) one unit at a time as names are asked for: a checkpoint written through it holds one
    unit's state in RAM, where `extract` would gather the model's (more than the RAM of a run
    whose state lives on NVMe or on the GPU). `meta(name)`: the tensor's dtype and shape,
    read from nothing."""

    def __init__(self, cache: _OneUnit, entries: dict[str, tuple[int, tuple[int, ...]]]) -> None:
        self._cache, self._entries = cache, entries

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._cache.get(self._entries[name][0], name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def meta(self, name: str) -> torch.Tensor:
        return torch.empty(self._entries[name][1], dtype=torch.float32, device="meta")


class _OneUnit:
    """The last unit read (weights and moments), dropped before the next is read."""

    def __init__(self, env: Env) -> None:
        self.env, self.unit = env, -1
        self.tensors: dict[str, torch.Tensor] = {}

    def get(self, unit: int, name: str) -> torch.Tensor:
        if unit != self.unit:
            self.tensors, self.unit = {}, -1
            weights, moments = _read_unit(self.env, unit)
            self.tensors, self.unit = weights | moments, unit
        return self.tensors[name]
