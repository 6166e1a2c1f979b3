"""Streamed updates: which units stream, what the ledger and the graph hold for them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slide_ir import OpKind, TrainConfig, load_machine, load_model
from slide_ir.planning.ledger import build_ledger
from slide_ir.planning.planner import plan
from slide_ir.planning.streaming import choose_streamed
from slide_ir.planning.units import resident_preference
from slide_ir.specs.config import parse_count_or_auto


@pytest.fixture(scope="module")
def h200():
    return load_machine("h200-16c-128g")


def test_streamed_units_move_state_to_pinned_ram_and_add_gpu_staging(h200):
    model = load_model("llama-3.2-3b")
    config = TrainConfig(batch=16, seq=1024, streamed=5, activations="cpu", host_weights="pinned")
    base = build_ledger(model, h200, config)
    led = build_ledger(model, h200, config, streamed=(0, 1, 2, 3, 4))
    layer, embed = model.layer_params, model.embedding_params
    head = model.final_norm_params + model.lm_head_params  # tied: the final norm alone
    # host RAM: master + moments move from pageable to pinned; the total is unchanged but for
    # the landing ring, which now holds every host-updated layer (24) instead of 3, and the
    # vocab landing slot, which the head no longer shares with the embedding (2 x embed B)
    # but has to itself (2 x head B)
    landing = 2 * layer * (24 - 3) - 2 * embed + 2 * head
    assert led.pinned_bytes() - base.pinned_bytes() == 12 * (embed + 4 * layer) + landing
    gpu = led.breakdown("gpu")["streamed optimizer state (fp32 master, moments)"]
    assert gpu == 12 * (embed + 4 * layer)  # a slot per streamed unit
    assert led.peak_bytes("cpu") - base.peak_bytes("cpu") == landing


def test_streamed_graph_updates_on_the_gpu_with_state_round_trips(h200):
    model = load_model("llama-3.2-3b")
    p = plan(model, h200, TrainConfig(batch=8, seq=1024, steps=2, streamed=3, resident=0))
    assert p.ledger.streamed == (0, 1, 2)
    kinds = [op.kind for op in p.graph.ops]
    assert kinds.count(OpKind.OPT_H2D) == kinds.count(OpKind.OPT_D2H) == 2 * 3
    assert kinds.count(OpKind.GPU_ADAM) == kinds.count(OpKind.W_D2H) == 2 * 3
    assert kinds.count(OpKind.ADAM) == 2 * (model.num_layers + 2 - 3)
    assert not any(op.id.startswith("s1.L1.g.d2h") for op in p.graph.ops)
    # step 2: state up waits for step 1's state down; weights up wait for the weights down
    assert p.graph.op("s2.L1.opt.h2d").deps == ("s1.L1.opt.d2h",)
    assert "s1.L1.w.d2h" in p.graph.op("s2.L1.w.h2d").deps
    assert p.graph.op("s1.L1.opt.h2d").work.bytes == 12 * model.layer_params


def _lane(p, lane):
    return [op.id for op in p.graph.ops if op.lane == lane]


@pytest.mark.parametrize("activations", ["gpu", "cpu"], ids=["inputs-on-device", "inputs-on-host"])
def test_state_uploads_are_spread_over_the_backward(h200, activations):
    """The embedding's state goes up at the loss; the layers' start while host-updated layers
    are still in backward, and each is queued before its own unit's recompute."""
    model = load_model("llama-3.2-3b")
    config = TrainConfig(
        batch=16,
        seq=1024,
        steps=2,
        streamed=14,
        activations=activations,
        resident=0,
        keep_activations=0,
    )
    p = plan(model, h200, config)
    ids = [op.id for op in p.graph.ops]
    h2d = _lane(p, "h2d")
    assert ids.index("s1.L0.opt.h2d") < ids.index("s1.L29.loss") < ids.index("s1.L1.opt.h2d")
    assert ids.index("s1.L13.opt.h2d") < ids.index("s1.L20.recompute")
    for layer in range(1, 14):
        assert ids.index(f"s1.L{layer}.opt.h2d") < ids.index(f"s1.L{layer}.recompute")
    ups = [i for i in h2d if "opt.h2d" in i and i.startswith("s1.")]
    assert ups == ["s1.L0.opt.h2d", *(f"s1.L{j}.opt.h2d" for j in range(13, 0, -1))]


def test_state_downloads_spill_into_the_next_forward_only_with_inputs_on_the_gpu(h200):
    """With the layer inputs on the GPU the last units' states go down after the backward (as
    many as the next forward and loss can carry, by the plan's estimate); with the inputs on
    the host each state follows its unit's weights."""
    model = load_model("llama-3.2-3b")
    config = TrainConfig(batch=16, seq=1024, steps=2, streamed=14, activations="gpu", resident=0)
    p = plan(model, h200, config)
    d2h = _lane(p, "d2h")
    after = d2h[d2h.index("s1.L0.w.d2h") + 1 : d2h.index("s2.L28.g.d2h")]
    spilled = [int(i.split(".")[1][1:]) for i in after if i.endswith("opt.d2h")]
    assert spilled and spilled[0] == 0 and spilled[1:] == sorted(spilled[1:], reverse=True)
    assert 0 in spilled and 13 not in spilled
    state = 12 * model.layer_params
    budget = 13 * 0.01 + 0.1  # seconds: generous bounds on forward + loss at this shape
    assert (len(spilled) - 1) * state <= budget * h200.link.duplex_bytes_per_s
    config = TrainConfig(batch=16, seq=1024, steps=2, streamed=14, activations="cpu", resident=0)
    host = plan(model, h200, config)
    d2h = _lane(host, "d2h")
    for unit in range(14):
        assert d2h[d2h.index(f"s1.L{unit}.w.d2h") + 1] == f"s1.L{unit}.opt.d2h"


def test_auto_streams_on_a_cpu_bound_h200_and_not_with_nvme_state(h200):
    model = load_model("llama-3.2-3b")
    chosen = choose_streamed(
        model, h200, TrainConfig(batch=16, seq=1024, streamed="auto", activations="cpu"), ()
    )
    assert chosen[:2] == resident_preference(model)[:2]  # the embedding first, then layer 1
    assert 2 <= len(chosen) < model.num_layers
    nvme = load_machine("h200-16c-128g", nvme=1)
    config = TrainConfig(batch=16, seq=1024, streamed="auto", optimizer="nvme", activations="cpu")
    assert choose_streamed(model, nvme, config, ()) == ()


def test_auto_keeps_the_gpu_under_its_margin_and_the_host_feasible(h200):
    model = load_model("llama-3.1-8b")
    config = TrainConfig(batch=32, seq=1024, streamed="auto")
    p = plan(model, h200, config)
    assert p.feasible, p.ledger.overflows()
    assert p.ledger.peak_bytes("gpu") <= 0.95 * h200.gpu.memory_bytes


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"streamed": 2, "optimizer": "nvme"}, "streamed=2 needs schedule 'sliding', optimizer"),
        ({"streamed": 1, "grad_accum": 2}, "grad_accum 1"),
        ({"streamed": -1}, "streamed must be a count >= 0 or 'auto', got -1"),
        ({"streamed": "most"}, "streamed must be a count >= 0 or 'auto', got 'most'"),
    ],
)
def test_bad_streamed_requests_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(batch=1, seq=64, **kwargs)


def test_streamed_count_is_bounded_by_the_sliding_units(h200):
    model = load_model("llama-3.2-1b")
    with pytest.raises(ValueError, match="streamed must be at most 16"):
        plan(model, h200, TrainConfig(batch=1, seq=64, resident=2, streamed=17))
    assert parse_count_or_auto("streamed", "auto") == "auto"
    assert parse_count_or_auto("streamed", "3") == 3


def test_auto_does_not_stream_for_a_small_estimated_gain():
    """On the 4090 PC the streamed counts that fit its GPU gain under MIN_GAIN in the estimate
    for 8B at batch 17 (at 16 two streamed units gain more): nothing streams, although a
    forced count is a valid, feasible plan."""
    model, pc = load_model("llama-3.1-8b"), load_machine("paper-pc-4090")
    config = TrainConfig(batch=17, seq=1024, streamed="auto", activations="cpu")
    assert choose_streamed(model, pc, config, ()) == ()
    assert choose_streamed(model, pc, replace(config, batch=16), ()) == (0, 1)
    assert plan(model, pc, TrainConfig(batch=17, seq=1024, streamed=2, activations="cpu")).feasible
