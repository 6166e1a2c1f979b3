"""The ledger's terms for the compute and the process: the CUDA context, the hidden-state
gradients, the token ids, the shared compute workspace (a layer's recompute and backward, or the
fused loss's chunk), the saved layer inputs on their tier, the kept tapes, and the host process.

Every schedule has these (the kept tapes only the sliding one); what differs between schedules is
where the training state lives (`state_terms`) and what the link moves (`transfer_terms`).
"""

from __future__ import annotations

from slide_ir.ir.drives import act_pool, saved_per_drive
from slide_ir.ir.graph import FEED_AHEAD, TOKEN_FIELDS, Tier
from slide_ir.ir.graph import PoolRole as R
from slide_ir.planning.terms import Terms
from slide_ir.planning.units import BF16, GIB
from slide_ir.program import MAX_PASS_STEPS
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.model import ModelSpec

# CUDA context, cuBLAS/cuDNN workspaces and allocator slack: typical for torch on one GPU.
CUDA_CONTEXT_BYTES = 3 * GIB // 4
# Host process: Python, torch and CUDA host libraries, data batches. Measured on the H200 machine
# (2026-11-29, llama-3.2-3b, resident runs): RSS less the planned host buffers, 1.5-2.3 GiB.
HOST_RUNTIME_BYTES = 2 * GIB


def common_gpu_terms(
    terms: Terms, model: ModelSpec, config: TrainConfig, flush: tuple[int, str] = (0, "")
) -> None:
    """`flush`: bytes and formula of other scratch of the `gpu` lane that the workspace serves
    too (ZeRO-Offload's per-parameter gradient copies at a bucket flush)."""
    b, s, h = config.batch, config.seq, model.hidden_size
    hidden = b * s * h * BF16
    terms.add(
        "gpu_context",
        Tier.GPU,
        1,
        CUDA_CONTEXT_BYTES,
        "CUDA context and workspaces",
        "fixed 0.75 GiB",
        static=True,
        role=R.ACCOUNTING,
    )
    terms.add(
        "gpu_hidden_grads",
        Tier.GPU,
        2,
        hidden,
        "hidden-state gradients",
        f"2 x b{b} x s{s} x h{h} x 2 B",
        role=R.HIDDEN_GRAD,
        shape=(b, s, h),
    )
    feed_terms(terms, config)
    # One scratch slot serves the layers' transient activations and the fused loss: both run on
    # the `gpu` lane, one at a time, so they never coexist.
    layer = model.layer_transient_bytes(b, s)
    chunk = lce_chunk_tokens(model, config)
    # the chunk's logits, plus the loss's returned gradients (LM head bf16, hidden states) before
    # autograd adds them into their buffers
    lce = (
        model.logits_bytes(b, s, fused=True, chunk_tokens=chunk)
        + (model.vocab_size + b * s) * h * BF16
    )
    terms.add(
        "gpu_workspace",
        Tier.GPU,
        1,
        max(layer, lce, flush[0]),
        "compute workspace (layer or fused LCE)",
        f"max(one layer's recompute+backward at b{b} s{s} = {layer / GIB:.2f} GiB, "
        f"{chunk}-token bf16 logits chunk + bf16 LM-head and hidden grads = {lce / GIB:.2f} GiB"
        f"{flush[1]})",
        role=R.WORKSPACE,
    )


def feed_terms(terms: Terms, config: TrainConfig) -> None:
    """What the data path holds: the micro-batch's token fields on the GPU (ids, labels, and
    packed documents' positions), the host slots the driver stages micro-batches in
    (`GraphInfo.feed_ahead` + 1 steps of them), and each step's loss on the GPU and its host
    copy, a slot per step of the longest pass."""
    b, s, ga = config.batch, config.seq, config.grad_accum
    fields = len(TOKEN_FIELDS) if config.document_mask else len(TOKEN_FIELDS) - 1
    tokens, what = fields * b * s * 8, f"{fields} x b{b} x s{s} x 8 B"
    terms.add("gpu_tokens", Tier.GPU, 1, tokens, "token ids and labels", what, static=True,
              role=R.TOKENS, shape=(fields, b, s))  # fmt: skip
    k = (FEED_AHEAD + 1) * ga
    terms.add("pinned_tokens", Tier.PINNED, k, tokens, "staged micro-batches (pinned)",
              f"{FEED_AHEAD + 1} steps x {ga} micro-batches x {what}", static=True,
              role=R.HOST_TOKENS, shape=(fields, b, s))  # fmt: skip
    for name, tier, role in (("gpu_losses", Tier.GPU, R.LOSSES),
                             ("pinned_losses", Tier.PINNED, R.HOST_LOSSES)):  # fmt: skip
        terms.add(name, tier, MAX_PASS_STEPS, 4, "step losses", f"{MAX_PASS_STEPS} x 4 B",
                  static=True, role=role, shape=(1,))  # fmt: skip


def lce_chunk_tokens(model: ModelSpec, config: TrainConfig) -> int:
    tokens = config.batch * config.seq
    chunk = config.lce_chunk_tokens or model.default_lce_chunk_tokens(config.lce_budget_bytes)
    return min(chunk, tokens)


def activation_terms(terms: Terms, model: ModelSpec, config: TrainConfig, drives: int) -> None:
    """Checkpointed layer inputs: all on the GPU, or a GPU window plus a CPU/NVMe home. The
    layers whose forward keeps its tape save no input: n - kept of them are saved (on the GPU,
    the input and output of a kept layer's forward besides). On NVMe each drive has its own
    slots for the layers whose inputs go to it."""
    b, s, h = config.batch, config.seq, model.hidden_size
    n = model.num_layers - config.kept_tapes
    hidden = b * s * h * BF16
    what = f"b{b} x s{s} x h{h} x 2 B"
    if config.activations == "gpu":
        k = n + 1 + min(config.kept_tapes, 1)
        terms.add("gpu_acts", Tier.GPU, k, hidden, "saved layer inputs", f"{k} x {what}",
                  role=R.HIDDEN, shape=(b, s, h))  # fmt: skip
        return
    terms.add(
        "gpu_acts",
        Tier.GPU,
        config.act_buffers,
        hidden,
        "layer-input window",
        f"{config.act_buffers} x {what}",
        role=R.HIDDEN,
        shape=(b, s, h),
    )
    if config.activations == "cpu":
        terms.add(
            "pinned_acts",
            Tier.PINNED,
            n,
            hidden,
            "saved layer inputs (pinned)",
            f"{n} x {what}",
            role=R.HOST_HIDDEN,
            shape=(b, s, h),
        )
    else:  # the staging of the NVMe copies: one slot with `lean_buffers`, each copy in turn
        k = 1 if config.lean_buffers else config.act_buffers
        terms.add("pinned_act_staging", Tier.PINNED, k, hidden,
                  "activation NVMe staging (pinned)", f"{k} x {what}", role=R.HOST_HIDDEN,
                  shape=(b, s, h))  # fmt: skip
        for drive, k in enumerate(saved_per_drive(n, drives)):
            if k:
                terms.add(act_pool(drive), Tier.NVME, k, hidden, "saved layer inputs (NVMe)",
                          f"{k} x {what}", role=R.NVME_HIDDEN, shape=(b, s, h))  # fmt: skip


def tape_terms(terms: Terms, model: ModelSpec, config: TrainConfig) -> None:
    """The tapes of the top `kept_tapes` decoder layers, each alive from its forward to its
    backward (`ModelSpec.layer_tape_bytes`)."""
    k = config.kept_tapes
    if not k:
        return
    b, s = config.batch, config.seq
    tape = model.layer_tape_bytes(b, s)
    terms.add("gpu_tapes", Tier.GPU, k, tape, "kept layer tapes (no recompute)",
              f"{k} x one layer's input + saved tensors at b{b} s{s} = {tape / GIB:.2f} GiB",
              role=R.TAPE)  # fmt: skip


def host_terms(terms: Terms) -> None:
    terms.add(
        "host_runtime",
        Tier.CPU,
        1,
        HOST_RUNTIME_BYTES,
        "process runtime (python, torch)",
        "fixed 2 GiB",
        static=True,
        role=R.ACCOUNTING,
    )
