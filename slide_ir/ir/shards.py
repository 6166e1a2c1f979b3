"""Which elements of a unit each data-parallel rank owns: the contract the planner shards graphs
by and the executor slices buffers by (`slide_ir.planning.sharding`, `executor.ranks`)."""

from __future__ import annotations


def shard_size(elements: int, nproc: int) -> int:
    """Elements of the largest shard (and of every padded part): ceil(elements / nproc)."""
    return -(-elements // nproc)


def shard_range(elements: int, nproc: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank `rank`'s shard of a unit of `elements`; the ranks' ranges tile
    [0, elements) in rank order (the last ones may be shorter, or empty, on tiny units)."""
    if not 0 <= rank < nproc:
        raise ValueError(f"rank must be within [0, {nproc}), got {rank}")
    c = shard_size(elements, nproc)
    return min(rank * c, elements), min((rank + 1) * c, elements)
