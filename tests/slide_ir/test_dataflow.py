"""Values in the IR: every op's reads wait for their writer, writers of one value are ordered
(data races found statically), the printed form shows values and round-trips, and every plan
the planner makes passes these checks."""

import pytest

from slide_ir import TrainConfig, load_machine
from slide_ir.ir.graph import Graph, GraphError, GraphInfo, Op, OpKind, Pool, PoolRole, Tier, Value
from slide_ir.ir.printing import format_graph, parse_graph
from slide_ir.planning.planner import plan
from slide_ir.specs.model_catalog import load_model

INFO = GraphInfo(schedule="sliding", model="tiny", machine="m", batch=1, seq=8, steps=1,
                 num_layers=2, params=100, flops_per_step=1e9)  # fmt: skip
POOLS = (
    Pool(name="units", tier=Tier.GPU, slots=2, slot_bytes=8, role=PoolRole.UNIT, units=(1, 2)),
    Pool(
        name="bf16",
        tier=Tier.PINNED,
        slots=2,
        slot_bytes=8,
        static=True,
        role=PoolRole.HOST_WEIGHTS,
        units=(1, 2),
    ),
)
W1 = Value.parse("L1.w@units.0")
HOME = Value.parse("L1.w@bf16.0")


def _op(op_id: str, lane: str = "gpu", **kw: object) -> Op:
    return Op(id=op_id, kind=OpKind.FWD, lane=lane, step=1, unit=1, **kw)  # type: ignore[arg-type]


def _graph(*ops: Op) -> Graph:
    return Graph(info=INFO, pools=POOLS, ops=ops)


def test_value_text_round_trips():
    v = Value(name="L12.g", slot="gpu_units.1", accumulate=True)
    assert str(v) == "L12.g@gpu_units.1+=" and Value.parse(str(v)) == v
    assert str(W1) == "L1.w@units.0" and not W1.accumulate


def test_a_read_after_its_writer_on_a_dependency_path_is_valid():
    up = _op("up", lane="h2d", acquires=("units.0",), reads=(HOME,), writes=(W1,))
    use = _op("use", deps=("up",), releases=("units.0",), reads=(W1,))
    assert len(_graph(up, use).ops) == 2


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        # the static home is the initial state; the slot of a ring is not
        ((_op("use", reads=(W1,)),), "op use: reads L1.w@units.0, which no earlier op writes"),
        (
            (
                _op("up", lane="h2d", reads=(HOME,), writes=(W1,)),
                _op("use", reads=(W1,)),  # no dependency on the upload
            ),
            "op use: reads L1.w@units.0 without waiting for its writer up",
        ),
        (
            (_op("a", lane="h2d", writes=(W1,)), _op("b", lane="d2h", writes=(W1,))),
            "op b: writes L1.w@units.0, unordered with a which writes it too",
        ),
        (
            (_op("a", writes=(Value.parse("L1.g@units.0+="),)),),
            "op a: reads L1.g@units.0, which no earlier op writes",  # += reads the old value
        ),
        ((_op("a", reads=(Value.parse("x@nope.0"),)),), "unknown slot 'nope.0'"),
    ],
)
def test_dataflow_races_are_found_statically(ops, message):
    with pytest.raises(GraphError, match=message):
        _graph(*ops)


def test_a_read_of_a_static_home_is_the_initial_state():
    assert _graph(_op("up", lane="h2d", reads=(HOME,))).ops[0].reads == (HOME,)


PLANS = {
    "sliding": {"placement": "small"},
    "sliding-host-inputs-accum": {"placement": "small", "activations": "cpu", "grad_accum": 2},
    "resident-streamed": {"resident": 2, "streamed": 3, "activations": "gpu"},
    "nvme": {"placement": "small", "activations": "nvme", "optimizer": "nvme"},
    "nvme-moments": {"placement": "small", "optimizer": "nvme-moments", "grad_accum": 2},
    "gpu-only": {"schedule": "gpu-only", "grad_accum": 2},
    "zero-offload": {"schedule": "zero-offload"},
    "zero-offload-accum-nvme": {"schedule": "zero-offload", "grad_accum": 2, "optimizer": "nvme"},
    "zero-offload-tied-accum": {"schedule": "zero-offload", "grad_accum": 3, "activations": "cpu"},
}


@pytest.mark.parametrize("name", PLANS)
def test_every_plan_passes_the_checks_and_prints_its_values(name):
    machine = load_machine("h200-16c-128g", nvme=2)
    config = TrainConfig(batch=2, seq=256, steps=2, **PLANS[name])  # type: ignore[arg-type]
    g = plan(load_model("llama-3.2-1b"), machine, config).graph  # validated when built
    assert parse_graph(format_graph(g)) == g
    assert Graph.from_json(g.to_json()) == g
    assert len(g.info.placement) == g.info.num_layers + 2
    compute = [op for op in g.ops if op.kind in (OpKind.FWD, OpKind.BWD, OpKind.RECOMPUTE)]
    assert all(op.reads for op in compute)
    assert {op.micro for op in g.ops} == set(range(config.grad_accum))


def test_the_backward_reads_the_tape_its_recompute_wrote():
    g = plan(load_model("llama-3.2-1b"), load_machine("h200-16c-128g"),
             TrainConfig(batch=2, seq=256, steps=1, placement="small")).graph  # fmt: skip
    rec, bwd = g.op("s1.L5.recompute"), g.op("s1.L5.bwd")
    assert rec.writes[0].name == "s1.L5.tape" and rec.writes[0] in bwd.reads
    assert [v.name for v in bwd.reads] == ["L5.w", "s1.L5.tape", "s1.L6.dx"]
    assert [v.name for v in bwd.writes] == ["L5.g", "s1.L5.dx"]
    hidden = g.pool(bwd.writes[1].slot.rpartition(".")[0])
    assert hidden.role == PoolRole.HIDDEN_GRAD and not hidden.static
    assert g.op("s1.L0.fwd").writes[1].name == "s1.tokens"
