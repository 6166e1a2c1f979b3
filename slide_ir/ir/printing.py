"""The compact printed form of a Graph: one line per op, `parse_graph(format_graph(g)) == g`.

Small schedules in tests are written in it. Lines are `key=value` tokens, shell-quoted:

    info schedule=sliding model=tiny machine=m batch=1 seq=8 steps=1 ... placement=sliding,...
    pool gpu_units tier=gpu slots=2 slot_bytes=1024 static=0 role=unit units=1,2,3
    pool gpu_acts tier=gpu slots=3 slot_bytes=512 static=0 role=hidden dtype=compute shape=1x8x32
    op s1.L1.fwd kind=fwd lane=gpu step=1 unit=1 flops=1e9 gemms=64x96x32,64x32x32*2
        attention=1x4x64x8 deps=s1.L1.w.h2d acquires=gpu_acts.1
        reads=L1.w@gpu_units.0,s1.L1.x@gpu_acts.0 writes=s1.L2.x@gpu_acts.1

(one line each). Values are `name@slot`, `+=` after an accumulating write, `#role` after one in a role
other than main (`vocab.Role`). Omitted fields take
their defaults (micro-batch 0, no work, no deps, no slots, no values, pool role `accounting`).
`#` starts a comment line.
"""

from __future__ import annotations

import shlex
from dataclasses import fields

from slide_ir.ir.graph import (
    Attention,
    Dtype,
    Gemm,
    Graph,
    GraphError,
    GraphInfo,
    Op,
    OpKind,
    Pool,
    PoolRole,
    Tier,
    UnitPlacement,
    Value,
    Work,
)

_WORK = ("flops", "attn_flops", "bytes", "elements")
_LISTS = ("deps", "acquires", "releases")
_VALUES = ("reads", "writes")


def format_graph(graph: Graph) -> str:
    info = {f.name: getattr(graph.info, f.name) for f in fields(GraphInfo)}
    info["placement"] = ",".join(graph.info.placement)
    lines = ["info " + _kv(info)]
    for p in graph.pools:
        items: dict[str, object] = {"tier": p.tier, "slots": p.slots, "slot_bytes": p.slot_bytes,
                                    "static": int(p.static), "role": p.role}  # fmt: skip
        if p.units:
            items["units"] = ",".join(map(str, p.units))
        if p.offsets:
            items["offsets"] = ",".join(map(str, p.offsets))
        if p.dtype:
            items["dtype"] = p.dtype
        if p.shape:
            items["shape"] = "x".join(map(str, p.shape))
        lines.append(f"pool {p.name} " + _kv(items))
    lines.extend(format_op(op) for op in graph.ops)
    return "\n".join(lines) + "\n"


def format_op(op: Op) -> str:
    """One op's line."""
    items: dict[str, object] = {"kind": op.kind, "lane": op.lane, "step": op.step,
                                "unit": op.unit}  # fmt: skip
    if op.micro:
        items["micro"] = op.micro
    items.update({k: getattr(op.work, k) for k in _WORK if getattr(op.work, k)})
    if op.work.gemms:
        items["gemms"] = ",".join(map(str, op.work.gemms))
    if op.work.attention is not None:
        items["attention"] = op.work.attention
    items.update({k: ",".join(getattr(op, k)) for k in _LISTS if getattr(op, k)})
    items.update({k: ",".join(map(str, getattr(op, k))) for k in _VALUES if getattr(op, k)})
    return f"op {op.id} " + _kv(items)


def _kv(items: dict[str, object]) -> str:
    return " ".join(f"{k}={shlex.quote(str(v))}" for k, v in items.items())


def parse_graph(text: str) -> Graph:
    info: GraphInfo | None = None
    pools: list[Pool] = []
    ops: list[Op] = []
    for n, line in enumerate(text.splitlines(), start=1):
        tokens = shlex.split(line, comments=True)
        if not tokens:
            continue
        try:
            head, kv = tokens[0], dict(t.split("=", 1) for t in tokens[1:] if "=" in t)
            if head == "info":
                info = _parse_info(kv)
            elif head == "pool":
                pools.append(_parse_pool(tokens[1], kv))
            elif head == "op":
                ops.append(_parse_op(tokens[1], kv))
            else:
                raise ValueError(f"unknown record {head!r} (expected info, pool or op)")
        except (KeyError, ValueError, IndexError) as exc:
            raise GraphError(f"line {n}: {exc}: {line.strip()}") from exc
    if info is None:
        raise GraphError("missing 'info' line")
    return Graph(info=info, pools=tuple(pools), ops=tuple(ops))


def _parse_info(kv: dict[str, str]) -> GraphInfo:
    typed: dict[str, object] = {}
    for f in fields(GraphInfo):
        if f.name in kv:
            raw = kv[f.name]
            if f.name == "placement":
                typed[f.name] = tuple(UnitPlacement(x) for x in raw.split(",") if x)
            else:
                typed[f.name] = (
                    float(raw) if f.type == "float" else int(raw) if f.type == "int" else raw
                )
    return GraphInfo(**typed)  # type: ignore[arg-type]


def _parse_pool(name: str, kv: dict[str, str]) -> Pool:
    return Pool(
        name=name,
        tier=Tier(kv["tier"]),
        slots=int(kv["slots"]),
        slot_bytes=int(kv["slot_bytes"]),
        static=kv.get("static", "0") == "1",
        role=PoolRole(kv.get("role", PoolRole.ACCOUNTING)),
        units=tuple(int(u) for u in kv.get("units", "").split(",") if u),
        offsets=tuple(int(u) for u in kv.get("offsets", "").split(",") if u),
        dtype=Dtype(kv.get("dtype", Dtype.NONE)),
        shape=tuple(int(n) for n in kv.get("shape", "").split("x") if n),
    )


def _parse_op(op_id: str, kv: dict[str, str]) -> Op:
    def listed(key: str) -> tuple[str, ...]:
        return tuple(x for x in kv.get(key, "").split(",") if x)

    def values(key: str) -> tuple[Value, ...]:
        return tuple(Value.parse(x) for x in listed(key))

    return Op(
        id=op_id,
        kind=OpKind(kv["kind"]),
        lane=kv["lane"],
        step=int(kv["step"]),
        unit=int(kv["unit"]),
        micro=int(kv.get("micro", 0)),
        work=Work(
            flops=float(kv.get("flops", 0)),
            attn_flops=float(kv.get("attn_flops", 0)),
            bytes=int(kv.get("bytes", 0)),
            elements=int(kv.get("elements", 0)),
            gemms=tuple(Gemm.parse(g) for g in listed("gemms")),
            attention=Attention.parse(kv["attention"]) if "attention" in kv else None,
        ),
        deps=listed("deps"),
        acquires=listed("acquires"),
        releases=listed("releases"),
        reads=values("reads"),
        writes=values("writes"),
    )
