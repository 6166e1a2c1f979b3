"""Schedule IR: validation names the offending op; JSON and printed forms round-trip."""

import pytest

from slide_ir.ir.graph import (
    Dtype,
    Graph,
    GraphError,
    GraphInfo,
    Op,
    OpKind,
    Pool,
    Role,
    Tier,
    Value,
    Work,
)
from slide_ir.ir.printing import format_graph, parse_graph

INFO = GraphInfo(
    schedule="sliding",
    model="tiny",
    machine="m",
    batch=1,
    seq=8,
    steps=1,
    num_layers=2,
    params=100,
    flops_per_step=1e9,
)

TINY = """
info schedule=sliding model=tiny machine=m batch=1 seq=8 steps=1 grad_accum=1 num_layers=2 params=100 flops_per_step=1e9
pool units tier=gpu slots=1 slot_bytes=64 static=0
pool master tier=cpu slots=2 slot_bytes=400 static=1
op s1.L1.w.h2d kind=h2d_param lane=h2d step=1 unit=1 bytes=64 acquires=units.0
op s1.L1.fwd kind=fwd lane=gpu step=1 unit=1 flops=5e8 deps=s1.L1.w.h2d releases=units.0
op s1.L2.w.h2d kind=h2d_param lane=h2d step=1 unit=2 bytes=64 deps=s1.L1.fwd acquires=units.0
op s1.L2.fwd kind=fwd lane=gpu step=1 unit=2 flops=5e8 deps=s1.L2.w.h2d releases=units.0
"""


def test_printed_form_round_trips():
    g = parse_graph(TINY)
    assert parse_graph(format_graph(g)) == g
    assert Graph.from_json(g.to_json()) == g
    assert g.ops_per_lane() == {"h2d": 2, "gpu": 2}
    assert g.tier_bytes()[Tier.GPU] == 64 and g.static_bytes()[Tier.CPU] == 800


def test_networkx_view_has_dependency_and_lane_edges():
    nxg = parse_graph(TINY).to_networkx()
    assert nxg.has_edge("s1.L1.w.h2d", "s1.L1.fwd")
    assert nxg.has_edge("s1.L1.fwd", "s1.L2.fwd")  # lane order


def _op(op_id, **kw):
    base = {"kind": OpKind.FWD, "lane": "gpu", "step": 1, "unit": 1}
    return Op(id=op_id, **{**base, **kw})


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ((_op("a", deps=("b",)), _op("b")), "op a: dependency 'b' is not an earlier op"),
        ((_op("a"), _op("a")), "op a: duplicate id"),
        ((_op("a", acquires=("units.0",)),), "op a: acquires 'units.0' which no later op releases"),
        ((_op("a", acquires=("nope.0",)),), "op a: unknown slot 'nope.0'"),
        (
            (
                _op("a", lane="h2d", acquires=("units.0",), releases=("units.0",)),
                _op("b", lane="d2h", acquires=("units.0",), releases=("units.0",)),
            ),
            "op b: reuses slot 'units.0' without depending on its release by a",
        ),
        ((_op("a", releases=("units.0",)),), "op a: releases 'units.0' which is not held"),
    ],
)
def test_invalid_graphs_name_the_op(ops, message):
    pools = (Pool(name="units", tier=Tier.GPU, slots=1, slot_bytes=8),)
    with pytest.raises(GraphError, match=message.replace("(", r"\(")):
        Graph(info=INFO, pools=pools, ops=ops)


def test_reuse_through_lane_order_is_valid():
    pools = (Pool(name="units", tier=Tier.GPU, slots=1, slot_bytes=8),)
    ops = (
        _op("a", acquires=("units.0",), releases=("units.0",)),
        _op("b", acquires=("units.0",), releases=("units.0",)),  # same lane: ordered after a
    )
    assert len(Graph(info=INFO, pools=pools, ops=ops).ops) == 2


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="slots must be > 0"):
        Pool(name="p", tier=Tier.GPU, slots=0, slot_bytes=8)
    with pytest.raises(ValueError, match="lane 'tpu'"):
        _op("a", lane="tpu")
    with pytest.raises(ValueError, match="flops must be >= 0"):
        Work(flops=-1)
    with pytest.raises(GraphError, match="version"):
        Graph.from_json('{"version": 99}')


def test_an_operand_role_prints_and_parses_back():
    tokens = Value(name="s1.tokens", slot="gpu_tokens.0", role=Role.TOKENS)
    grads = Value(name="U0.g", slot="gpu_units.0", accumulate=True, role=Role.TIED)
    assert str(tokens) == "s1.tokens@gpu_tokens.0#tokens"
    assert str(grads) == "U0.g@gpu_units.0+=#tied"
    assert str(Value(name="x", slot="a.0")) == "x@a.0"  # the main role is left out
    for v in (tokens, grads):
        assert Value.parse(str(v)) == v
    with pytest.raises(ValueError, match="unknown role 'kept'"):
        Value.parse("x@a.0#kept")


def test_an_op_finds_its_operands_by_role():
    tape = Value(name="L1.tape", slot="gpu_tapes.0", role=Role.TAPE)
    op = Op(id="s1.L1.fwd", kind=OpKind.FWD, lane="gpu", step=1, unit=1,
            writes=(Value(name="L2.x", slot="gpu_acts.1"), tape))  # fmt: skip
    assert op.written_as(Role.TAPE) == tape
    assert op.written_as(Role.TOKENS) is None and op.read_as(Role.TAPE) is None


def test_a_pools_dtype_and_shape_print_and_read_back():
    pool = Pool(name="pinned_acts", tier=Tier.PINNED, slots=2, slot_bytes=64, dtype=Dtype.COMPUTE,
                shape=(1, 4, 8))  # fmt: skip
    graph = Graph(info=INFO, pools=(pool,), ops=())
    assert "dtype=compute shape=1x4x8" in format_graph(graph)
    assert parse_graph(format_graph(graph)).pools == (pool,)
    assert Graph.from_json(graph.to_json()).pools == (pool,)
