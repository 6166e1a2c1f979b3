"""The ranks of a data-parallel run: who this process is, its process groups, its shards.

The collectives of one process group must be issued in the same order on every rank, and the
lanes issue theirs from threads of their own: so each thread that issues collectives has a
group of its own, and within it the order is the graph's (lanes walk their ops in list order)
or the main thread's. `net`: the graph's reduce-scatters and all-gathers; `cpu` and `gpu`: the
squared norms per-unit clipping sums over a unit's shards; `main`: the step's loss and the
state read a unit at a time (checkpoints, the final hand-back). Host groups use gloo; on CUDA
the `net` and `gpu` groups use NCCL.

Rank r owns elements [r c, min((r + 1) c, q)) of a unit of q elements, c = ceil(q / N)
(`slide_ir.ir.shards.shard_range`); the unit's GPU buffers hold N c elements so every
rank's part has the same size, as NCCL's collectives want.

Every collective times out, and a rank that fails publishes its error in the rendezvous store
(`fail`): the others name it (`peer_failure`) instead of reporting a broken connection.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from slide_ir.ir.shards import shard_range, shard_size

TIMEOUT_S = 600.0  # a collective waiting longer fails the run (a peer is gone or stuck)
_FAILED = "slide/failed"
_LANE_GROUPS = ("net", "gpu", "cpu", "main")


class RankFailure(RuntimeError):
    """Another rank failed; the message names it and its error."""


@dataclass(kw_only=True)
class Ranks:
    rank: int
    nproc: int
    groups: dict[str, dist.ProcessGroup] = field(repr=False)
    store: dist.Store | None = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, numel: int) -> tuple[int, int]:
        """[start, end) of this rank's shard of a unit of `numel` elements."""
        return shard_range(numel, self.nproc, self.rank)

    def padded(self, numel: int) -> int:
        """Elements of a unit's buffer that collectives split into N equal parts."""
        return self.nproc * shard_size(numel, self.nproc)

    def reduce_scatter(self, flat: torch.Tensor, numel: int) -> None:
        """Sum `flat` (a unit's padded buffer) over the ranks, in place: this rank's part then
        holds the sum (the rest is left as it was)."""
        c = shard_size(numel, self.nproc)
        whole = flat[: self.nproc * c]
        mine = whole[self.rank * c : (self.rank + 1) * c]
        _REDUCE_SCATTER(mine, whole, group=self.groups["net"])

    def all_gather(self, flat: torch.Tensor, numel: int) -> None:
        """Every rank's part of `flat` (a unit's padded buffer) to every rank, in place."""
        c = shard_size(numel, self.nproc)
        whole = flat[: self.nproc * c]
        _ALL_GATHER(whole, whole[self.rank * c : (self.rank + 1) * c], group=self.groups["net"])

    def sum_(self, t: torch.Tensor, group: str) -> torch.Tensor:
        """`t` summed over the ranks, in place, on the group of the thread calling."""
        dist.all_reduce(t, group=self.groups[group])
        return t

    def barrier(self) -> None:
        """Wait until every rank's main thread is here."""
        dist.barrier(group=self.groups["main"])

    def broadcast_int(self, value: int) -> int:
        """Rank 0's `value` on every rank (the main thread's group)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(t, src=0, group=self.groups["main"])
        return int(t[0])

    def gather_parts(self, part: torch.Tensor, numel: int) -> torch.Tensor:
        """A unit's whole flat tensor from every rank's shard `part` (main thread's group)."""
        c = shard_size(numel, self.nproc)
        mine = torch.zeros(c, dtype=part.dtype)
        mine[: part.numel()].copy_(part)
        whole = torch.empty(self.nproc * c, dtype=part.dtype)
        _ALL_GATHER(whole, mine, group=self.groups["main"])
        return whole[:numel]

    def fail(self, message: str) -> None:
        """Publish this rank's failure (the first one published stays)."""
        if self.store is None:
            return
        with contextlib.suppress(Exception):  # the store's host may be gone already
            self.store.compare_set(_FAILED, "", f"rank {self.rank}: {message}")

    def settle(self, exc: BaseException) -> RankFailure | None:
        """What stopped this rank when `exc` did: another rank's failure (returned), or this
        rank's own (published for the others, None returned)."""
        failure = self.failure_of(exc)
        if failure is None:
            self.fail(f"{type(exc).__name__}: {exc}")
        return failure

    def failure_of(self, exc: BaseException) -> RankFailure | None:
        """What stopped this rank when `exc` did, if another rank did: the failure it
        published, or (a collective broke and nothing was published) a rank that died
        without a word. None: `exc` is this rank's own."""
        peer = self.peer_failure()
        if peer is not None:
            who, _, what = peer.partition(": ")
            return RankFailure(f"{who} failed: {what}")
        if _broken_collective(exc):
            return RankFailure(f"a rank stopped without saying why (killed, or out of memory?): "
                               f"{str(exc).splitlines()[0][:200]}")  # fmt: skip
        return None

    def peer_failure(self) -> str | None:
        """What another rank published with `fail`, if it did."""
        if self.store is None:
            return None
        try:
            if not self.store.check([_FAILED]):
                return None
            said = self.store.get(_FAILED).decode()
        except Exception:  # the store's host (rank 0's process) may be gone
            return None
        return None if said.startswith(f"rank {self.rank}:") else said

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _broken_collective(exc: BaseException) -> bool:
    """A collective failed because a peer's end went away (gloo's transport says so; NCCL's
    errors are `DistError`s)."""
    text = str(exc)
    return isinstance(exc, dist.DistError) or "gloo" in text or "closed by peer" in text


_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def init_from_env(device_type: str) -> Ranks | None:
    """The ranks of a process torchrun started (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in
    the environment); None for a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    rank = int(os.environ["RANK"])
    timeout = timedelta(seconds=TIMEOUT_S)
    store, rank, world = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    store = dist.PrefixStore("slide", store)
    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device_backend = "nccl" if cuda else "gloo"
    dist.init_process_group(
        device_backend, store=store, rank=rank, world_size=world, timeout=timeout
    )
    backends = {lane: device_backend if lane in ("net", "gpu") else "gloo" for lane in _LANE_GROUPS}
    groups = {lane: dist.new_group(backend=b, timeout=timeout) for lane, b in backends.items()}
    return Ranks(rank=rank, nproc=world, groups=groups, store=store)
