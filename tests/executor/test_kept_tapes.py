"""Layers whose forward keeps its autograd tape (no recompute, `keep_activations`) train
exactly as recomputed ones in CPU mode: the same kernels run on the same inputs, only once, so
losses and weights are bitwise equal to the all-recompute run, under every placement of the
inputs and of the units (a kept layer's cache slot is reused before its backward, which finds
its weights in another slot; a resident layer's never move) and with several micro-batches.
"""

from __future__ import annotations

import sys

import pytest
import torch
from hf_models import spec_of, tiny_config
from runs import assert_bitwise_equal, assert_matches_reference, graph_of, run_executor

from executor import fused, layers
from executor.layout import layer_layout
from executor.tape import Tape
from slide_ir import OpKind
from slide_ir.specs.model import ModelSpec
from slide_kernels import reference

CASES = {
    # 2 of 4 layers kept, the top one's weights held on the GPU, the other's slot reused
    "inputs-on-host": (False, {"activations": "cpu", "cache_units": 2}, 2),
    # every layer kept: no recompute, nothing saved to the host
    "all-layers-tied": (True, {"activations": "cpu", "cache_units": 3}, 4),
    "inputs-on-device": (False, {"activations": "gpu", "cache_units": 2}, 3),
    "inputs-on-nvme": (False, {"activations": "nvme", "cache_units": 2, "drives": 1}, 1),
    "micro-batches": (False, {"activations": "cpu", "cache_units": 2, "grad_accum": 2}, 2),
    "mixed-placement": (
        False,
        {"resident": 2, "streamed": 2, "activations": "cpu", "cache_units": 2},
        3,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kept_tapes_equal_recompute_bitwise(case: str) -> None:
    tied, config, kept = CASES[case]
    steps = 4
    recomputed = run_executor(tied, steps=steps, keep_activations=0, **config)  # type: ignore[arg-type]
    kept_run = run_executor(tied, steps=steps, keep_activations=kept, **config)  # type: ignore[arg-type]
    assert_bitwise_equal(kept_run, recomputed)
    spans = [s for s in kept_run.trace.spans if s.step == 1]
    recomputes = {s.unit for s in spans if s.kind == OpKind.RECOMPUTE}
    saves = {s.unit for s in spans if s.kind == OpKind.ACT_SAVE}
    top = set(range(5 - kept, 5))
    assert not recomputes & top and recomputes == set(range(1, 5 - kept))
    assert not saves & top


def test_kept_tapes_match_pytorch_loop() -> None:
    config = {"activations": "cpu", "cache_units": 2, "keep_activations": 2}
    assert_matches_reference(run_executor(False, **config), False, config)


def test_kept_layers_have_no_recompute_in_the_graph() -> None:
    g = graph_of(False, steps=1, activations="cpu", cache_units=2, keep_activations=2)
    by_id = {op.id: op for op in g.ops}
    assert "s1.L4.recompute" not in by_id and "s1.L2.recompute" in by_id
    fwd, bwd = by_id["s1.L4.fwd"], by_id["s1.L4.bwd"]
    assert [v.name for v in fwd.writes] == ["s1.L5.x", "s1.L4.tape"]
    assert fwd.writes[1].slot.startswith("gpu_tapes.")
    assert bwd.reads[1] == fwd.writes[1] and fwd.writes[1].slot in bwd.releases
    assert "s1.L4.act.save" not in by_id and "s1.L4.act.load" not in by_id


# -- what a kept tape holds ------------------------------------------------------------------
def _gpu_kernels_in_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path of `executor.fused` on CPU bf16 tensors: the kernels' own autograd
    Functions (so exactly what they save for backward), their launches done in torch, and q/k/v
    and gate/up as one GEMM each."""
    rms, rope, swiglu = (sys.modules[f"slide_kernels.{m}"] for m in ("rms_norm", "rope", "swiglu"))

    def rms_forward(x2d: torch.Tensor, w: torch.Tensor, eps: float):  # type: ignore[no-untyped-def]
        rstd = torch.rsqrt(x2d.float().pow(2).mean(-1) + eps)  # (rows,) fp32, as the kernel
        return (x2d.float() * rstd[:, None]).to(x2d.dtype) * w, rstd

    for module in (rms, rope, swiglu):
        monkeypatch.setattr(module, "use_triton", lambda *_: True)
    monkeypatch.setattr(rms, "rms_norm_forward", rms_forward)
    monkeypatch.setattr(rope, "rope_apply", lambda q, k, c, s, backward: reference.rope(q, k, c, s))
    monkeypatch.setattr(swiglu, "swiglu_forward", reference.swiglu)
    monkeypatch.setattr(fused, "_triton", lambda _: True)
    monkeypatch.setattr(fused, "FUSE_ON_CPU", True)


def _tape_bytes(spec: ModelSpec, batch: int, seq: int) -> int:
    """Bytes a kept tape holds alive: the storages of its saved tensors (less the unit's weights,
    which `Tape` packs as views, and the RoPE tables, which the run owns) and its input copy;
    its root holds one element."""
    dtype, cpu = torch.bfloat16, torch.device("cpu")
    layout = layer_layout(spec, 1)
    w = (torch.randn(layout.numel) * 0.05).to(dtype)
    rope = layers.make_rope(spec, seq, cpu, dtype)
    tape = Tape(weights=w)
    tape.x = torch.randn(batch, seq, spec.hidden_size, dtype=dtype).requires_grad_()
    tape.leaves = {k: v.detach().requires_grad_() for k, v in layout.views(w).items()}
    held: dict[int, int] = {}

    def pack(t: torch.Tensor) -> object:
        packed = tape.pack(t)
        if isinstance(packed, torch.Tensor):
            held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return packed

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, tape.unpack):
        tape.root = layers.decoder_layer_taped(tape.x, tape.leaves, spec, rope)
    assert tape.root is not None and tape.root.untyped_storage().nbytes() == dtype.itemsize
    held[tape.x.untyped_storage().data_ptr()] = tape.x.untyped_storage().nbytes()
    for t in (rope.cos, rope.sin):
        held.pop(t.untyped_storage().data_ptr(), None)
    return sum(held.values())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # qwen2: tied, q/k/v biases
@pytest.mark.parametrize(("batch", "seq"), [(2, 16), (3, 40)])
def test_ledger_tape_bytes_are_what_a_kept_forward_saves(
    monkeypatch: pytest.MonkeyPatch, arch: str, batch: int, seq: int
) -> None:
    """`ModelSpec.layer_tape_bytes` (the `gpu_tapes` slot) against the executor's forward."""
    _gpu_kernels_in_torch(monkeypatch)
    spec = spec_of(tiny_config(arch))
    measured, ledger = _tape_bytes(spec, batch, seq), spec.layer_tape_bytes(batch, seq)
    assert measured <= ledger <= 1.01 * measured, (measured, ledger)
