"""The executor on CUDA: BF16 numerics against plain PyTorch, and no allocation after step 1.

BF16 rule (as for the kernels): against an FP32 gold run (same model, data and AdamW), our
BF16 run's error is at most ~2x that of a plain PyTorch BF16 mixed-precision loop (BF16 model,
FP32 master weights + torch AdamW on the GPU). Errors: per-step loss, and weights as
||w - w_gold|| / ||w_gold - w_init|| (relative to how far training moved them).
"""

from __future__ import annotations

import pytest
import torch
from hf_models import hf_model, spec_of, state_dict_fp32, tiny_config

from bench.kernels.gpu_parity import plain_loop, weight_error, within_bf16_noise
from executor.adam import AdamWConfig
from slide.session import train
from slide_ir import TrainConfig, load_machine

pytestmark = pytest.mark.gpu

B, S, STEPS, LR = 4, 128, 10, 1e-3
DEVICE = "cuda"
PINNED = {"placement": "small"}  # each case's placement as named (the search would pick its own)
CONFIG = tiny_config(
    "llama",
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=4096,
    max_position_embeddings=512,
)


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(0, CONFIG["vocab_size"], (B, S + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def _plain_loop(dtype: torch.dtype) -> tuple[list[float], dict[str, torch.Tensor]]:
    return plain_loop(lambda: hf_model(CONFIG), _batches(STEPS), dtype, LR, DEVICE)


def _ours(config: dict, on_step=None):  # type: ignore[no-untyped-def]
    return train(
        spec_of(CONFIG),
        load_machine("h200-16c-128g"),
        TrainConfig(batch=B, seq=S, steps=STEPS, **{**PINNED, **config}),
        initial_state=state_dict_fp32(hf_model(CONFIG)),
        batches=_batches(STEPS * config.get("grad_accum", 1)),
        optim=AdamWConfig(lr=LR),
        device=DEVICE,
        dtype=torch.bfloat16,
        on_step=on_step,
    )


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"resident": 3, "activations": "gpu"},
        {"streamed": 3},
        {"streamed": 4, "activations": "gpu"},
        {"keep_activations": 3, "cache_units": 2},  # layer 4's slot reused before its backward
        {"keep_activations": 6, "resident": 2, "streamed": 1},
    ],
    ids=[
        "sliding",
        "resident",
        "streamed",
        "streamed-inputs-on-device",
        "kept-tapes",
        "kept-tapes-mixed",
    ],
)
def test_bf16_run_within_bf16_noise_of_plain_pytorch(config: dict) -> None:
    init = state_dict_fp32(hf_model(CONFIG))
    gold_losses, gold = _plain_loop(torch.float32)
    ref_losses, ref = _plain_loop(torch.bfloat16)
    result = _ours(config)
    ref_loss_err = max(abs(a - b) for a, b in zip(ref_losses, gold_losses, strict=True))
    our_loss_err = max(abs(a - b) for a, b in zip(result.losses, gold_losses, strict=True))
    ref_w, our_w = weight_error(ref, gold, init), weight_error(result.final_state, gold, init)
    print(f"loss err: ours {our_loss_err:.2e} torch-bf16 {ref_loss_err:.2e}; "
          f"weights: ours {our_w:.3f} torch-bf16 {ref_w:.3f}")  # fmt: skip
    assert within_bf16_noise((our_loss_err, our_w), (ref_loss_err, ref_w))


@pytest.mark.parametrize("graph_steps", [16, 3], ids=["one-graph", "repeated-graph"])
def test_allocation_count_flat_after_first_step(monkeypatch, graph_steps: int) -> None:
    """cudaMalloc calls (the caching allocator's segments) stop after step 1, also when the
    run repeats a 3-step graph (the lanes keep their streams across repetitions)."""
    from slide_ir.planning import programs

    monkeypatch.setattr(programs, "GRAPH_STEPS", graph_steps)
    counts: list[int] = []

    def on_step(step: int, loss: float, lr: float, metrics: dict) -> None:
        stats = torch.cuda.memory_stats()
        counts.append(stats.get("num_device_alloc", stats["segment.all.allocated"]))

    _ours({"resident": 1, "streamed": 2}, on_step)
    print("cudaMalloc count after each step:", counts)
    # the step after the first can overlap its tail, so the steady state starts at step 2
    assert counts[1:] == [counts[1]] * (len(counts) - 1)


@pytest.mark.parametrize("config", [{}, {"streamed": 2, "resident": 1}], ids=["sliding", "mixed"])
def test_repeated_graph_and_saves_on_cuda(monkeypatch, config: dict) -> None:
    """10 steps as repetitions of a 3-step graph equal one 10-step graph, bitwise; a save
    inside a repetition reads the state that a run of that many steps ends with."""
    from slide_ir.planning import programs

    whole = _ours(config)
    monkeypatch.setattr(programs, "GRAPH_STEPS", 3)
    saved: dict[int, dict[str, torch.Tensor]] = {}

    def on_save(step, read_state):  # type: ignore[no-untyped-def]
        saved[step] = {k: v.clone() for k, v in read_state()[0].items()}

    repeated = train(
        spec_of(CONFIG),
        load_machine("h200-16c-128g"),
        TrainConfig(batch=B, seq=S, steps=STEPS, **{**PINNED, **config}),
        initial_state=state_dict_fp32(hf_model(CONFIG)),
        batches=_batches(STEPS),
        optim=AdamWConfig(lr=LR),
        device=DEVICE,
        dtype=torch.bfloat16,
        save_every=4,
        on_save=on_save,
    )
    assert repeated.losses == whole.losses
    assert all(torch.equal(t, whole.final_state[k]) for k, t in repeated.final_state.items())
    assert sorted(saved) == [4, 8]
    monkeypatch.setattr(programs, "GRAPH_STEPS", 16)
    four = train(
        spec_of(CONFIG),
        load_machine("h200-16c-128g"),
        TrainConfig(batch=B, seq=S, steps=4, **{**PINNED, **config}),
        initial_state=state_dict_fp32(hf_model(CONFIG)),
        batches=_batches(4),
        optim=AdamWConfig(lr=LR),
        device=DEVICE,
        dtype=torch.bfloat16,
    )
    assert all(torch.equal(saved[4][k], t) for k, t in four.final_state.items())


@pytest.mark.parametrize("config", [{}, {"streamed": 2, "resident": 1}], ids=["sliding", "mixed"])
def test_cuda_trace_obeys_its_graph(config: dict) -> None:
    """The measured trace (CUDA events on the GPU lanes, host clock on the others) keeps the
    graph's rules; 1 ms absorbs the skew between the two clocks."""
    from slide_ir.ir.trace import trace_violations
    from slide_ir.planning.planner import plan

    graph = plan(
        spec_of(CONFIG),
        load_machine("h200-16c-128g"),
        TrainConfig(batch=B, seq=S, steps=STEPS, **{**PINNED, **config}),
    ).graph
    result = _ours(config)
    assert result.trace.spans
    assert trace_violations(result.trace, graph, tolerance_s=1e-3) == []


def test_completions_create_their_cuda_events_up_front() -> None:
    """torch makes a CUDA event's driver object on its first record; completions record theirs
    when made, so the first run of a pass's graph (the last pass's, in the steady state) creates
    none. `cuda_event` is 0 until the driver object exists."""
    from executor.completion import Completions

    assert torch.cuda.Event(enable_timing=True).cuda_event == 0  # torch still creates lazily
    completions = Completions(["h2d", "gpu", "cpu"], on_stream={"h2d", "gpu"})
    for op_id in ("h2d", "gpu"):
        assert all(event.cuda_event != 0 for event in completions[op_id].gpu_events())
        assert completions[op_id].event.query()  # reads as done, as a never-recorded one does
    assert completions["cpu"].event is None
