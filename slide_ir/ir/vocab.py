"""The IR's closed vocabularies: op kinds, tiers, pool roles, element dtypes, unit placements,
operand roles, and lane kinds.

Each is a `StrEnum` whose members are documented where they are defined, so an engine's handler
table keyed by one of them can be checked for covering every member. A lane is named by its kind
and, for a kind with several lanes (one per NVMe drive), a number: `nvme0`, `nvme1`.
"""

from __future__ import annotations

import functools
from enum import StrEnum


class OpKind(StrEnum):
    """The closed op vocabulary. Every engine has a handler for each member.

    Operands (`Op.reads` -> `Op.writes`), in this order; `w`/`g` a unit's weights/gradient:
    FWD (w, x) -> (x'); the embedding's FWD (w) -> (x', tokens): it takes the micro-batch in;
    RECOMPUTE (w, x) -> (tape); BWD (w, tape, dx') -> (g, dx), the embedding's (w, tokens, dx')
    -> (g); LOSS (w, x, tokens[, tied embedding w]) -> (g, dx[, tied embedding g]);
    EVAL_LOSS (w, x, tokens[, tied embedding w]) -> (): the loss only, for an eval graph;
    GPU_ADAM (g, state) -> (w, state); OPT_H2D (master, moments) -> (state); OPT_D2H the
    reverse; GRAD_ACCUM (landed g) -> (accumulator); ADAM reads the landed g, the accumulator
    and the state (RAM or NVMe staging) and writes the state and the pinned w (a unit whose
    upload is cast from the master has none), and a speculative one the rollback copy, told
    apart by their pools' roles; REDO reads the landed g or accumulator, the scale and the
    rollback copy and writes the state and the pinned w; every other
    kind is a copy (src) -> (dst)."""

    FWD = "fwd"  # forward of one layer on the GPU
    RECOMPUTE = "recompute"  # forward again from the saved layer input, before its backward
    BWD = "bwd"  # backward of one layer
    LOSS = "loss"  # head stage: final norm + LM head + cross-entropy, forward and backward
    EVAL_LOSS = "eval_loss"  # the head stage's forward only: an eval batch's summed token loss
    H2D_PARAM = "h2d_param"  # upload a layer's BF16 weights into a GPU cache unit
    D2H_GRAD = "d2h_grad"  # download a layer's gradients into pinned CPU memory
    ADAM = "adam"  # CPU AdamW update of one layer (FP32 master + moments), BF16 cast fused
    GPU_ADAM = "gpu_adam"  # fused AdamW on the GPU for a resident or streamed layer
    OPT_H2D = "opt_h2d"  # upload a streamed layer's FP32 master + moments for its GPU AdamW
    OPT_D2H = "opt_d2h"  # download them back after the update
    W_D2H = "w_d2h"  # download a streamed layer's updated BF16 weights into the pinned copy
    # FP32 master -> compute-dtype weights on the CPU: ZeRO-offload's after its updates; the
    # sliding schedule's into a weight-staging slot right before the unit's upload
    CAST = "cast"
    GRAD_ACCUM = "grad_accum"  # add a micro-batch's landed BF16 grads into the CPU FP32 accumulator
    # global clipping: each parameter's gradient norm of a unit (where its step's gradient is
    # whole: the GPU for device-updated units, the landed copy on the host for the others)
    GRAD_NORM = "grad_norm"
    NORM = "norm"  # the step's global norm from every unit's: the clip scale and finiteness
    # global clipping's validation of a speculative ADAM (one that wrote its unit's state before
    # the norm was known, saving the old state first): after NORM, nothing in a step that needs
    # no clipping; else the saved state restored and, in a clipped step, the update redone
    # with the scale (`slide_ir.planning.speculation`)
    REDO = "redo"
    ACT_SAVE = "act_save"  # copy a layer's input activation GPU -> CPU (d2h lane)
    ACT_LOAD = "act_load"  # copy it back CPU -> GPU ahead of the layer's recompute (h2d lane)
    NVME_READ = "nvme_read"  # read optimizer state or activations from NVMe
    NVME_WRITE = "nvme_write"  # write them back
    # Collectives on a `net` lane (multi-GPU layouts; work.bytes = the full logical message):
    ALL_REDUCE = "all_reduce"  # sum a tensor across a group (TP blocks, unsharded DP grads)
    REDUCE_SCATTER = "reduce_scatter"  # sum and leave each rank its shard (sharded DP grads)
    ALL_GATHER = "all_gather"  # every rank gets every shard (weights after a sharded update)
    ALL_TO_ALL = "all_to_all"  # each rank sends a slice to every other (EP dispatch/combine)
    SEND_RECV = "send_recv"  # point to point (PP activations/grads, the CP key/value ring)


class Tier(StrEnum):
    """Where bytes live. `cpu` is pageable host RAM; `pinned` is page-locked host RAM."""

    GPU = "gpu"
    PINNED = "pinned"
    CPU = "cpu"
    NVME = "nvme"


class PoolRole(StrEnum):
    """What a pool's slots hold, so an engine knows how to allocate it without its name."""

    ACCOUNTING = "accounting"  # counted, never allocated by Slide: CUDA context, process, hand-back
    WORKSPACE = "workspace"  # compute scratch torch allocates; a recompute's tape lives there
    TAPE = "tape"  # autograd tapes a forward keeps for its backward; torch allocates them
    TOKENS = "tokens"  # the current micro-batch's token ids and labels on the GPU
    HOST_TOKENS = "host_tokens"  # micro-batches staged in host RAM for their upload (the feed)
    HIDDEN = "hidden"  # layer inputs (B x S x H) on the GPU
    HIDDEN_GRAD = "hidden_grad"  # gradients w.r.t. hidden states on the GPU
    HOST_HIDDEN = "host_hidden"  # saved layer inputs, or their NVMe staging, in pinned RAM
    NVME_HIDDEN = "nvme_hidden"  # saved layer inputs on NVMe
    UNIT = "unit"  # one unit's compute-dtype weights + grads on the GPU (a cache-ring slot)
    RESIDENT = "resident"  # units whole on the GPU: weights, grads, FP32 master and moments
    STREAM_STATE = "stream_state"  # a streamed unit's FP32 master, moments and grad on the GPU
    DEVICE_WEIGHTS = "device_weights"  # every unit's weights on the GPU, one flat slot
    DEVICE_GRADS = "device_grads"  # every unit's gradients on the GPU, one flat slot
    GRAD_LANDING = "grad_landing"  # pinned RAM that downloaded gradients land in
    HOST_WEIGHTS = "host_weights"  # the pinned compute-dtype copy an upload reads
    WEIGHT_STAGING = "weight_staging"  # a pinned ring an upload reads, cast from the master
    MASTER_STAGING = "master_staging"  # RAM the FP32 master is read into from NVMe for a cast
    GRAD_ACCUM = "grad_accum"  # FP32 gradient accumulators in RAM
    MASTER = "master"  # FP32 master weights in RAM (pinned for streamed units)
    MOMENTS = "moments"  # Adam moments in RAM (pinned for streamed units)
    NVME_STATE = "nvme_state"  # optimizer state on NVMe, striped over the drives
    NVME_GRADS = "nvme_grads"  # global clipping's held gradients on NVMe, each on one drive
    OPT_STAGING = "opt_staging"  # RAM staging of the NVMe optimizer-state stripes
    GRAD_NORMS = "grad_norms"  # a unit's per-parameter gradient norms (FP32, pinned)
    GRAD_SCALE = "grad_scale"  # the step's clip scale and global norm (FP32, pinned)
    ROLLBACK = "rollback"  # a speculated unit's master and moments before its update, in RAM
    LOSSES = "losses"  # each step's summed loss on the GPU, accumulated over its micro-batches
    HOST_LOSSES = "host_losses"  # their host copies, which the driver reports


class Dtype(StrEnum):
    """What a pool's elements are, so an engine allocates them without guessing from byte
    counts: `compute` is the run's compute dtype (BF16 on a GPU; FP32 in the CPU mode),
    `moments` the Adam moments' (FP32 or BF16, `GraphInfo.moments_dtype`)."""

    NONE = ""  # not one element array: accounting, torch's workspaces, NVMe regions
    COMPUTE = "compute"
    FP32 = "fp32"
    MOMENTS = "moments"
    INT64 = "int64"  # token ids, labels and positions


class UnitPlacement(StrEnum):
    """Where a unit lives and who updates it (the graph's info lists one per unit)."""

    RESIDENT = "resident"  # whole on the GPU, updated there
    STREAMED = "streamed"  # slides; its state visits the GPU for a GPU AdamW
    SLIDING = "sliding"  # slides; host AdamW, state in RAM
    NVME = "nvme"  # slides (or stays, ZeRO-offload); host AdamW, state homed on NVMe
    OFFLOADED = "offloaded"  # ZeRO-offload: weights stay on the GPU, host AdamW, state in RAM


LANE_KINDS = ("gpu", "h2d", "d2h", "cpu", "nvme", "net")


@functools.cache  # a graph has a handful of lanes and thousands of ops
def lane_kind(lane: str) -> str:
    """The lane's kind: `nvme0`, `nvme1` are lanes of kind `nvme` (one per drive)."""
    base = lane.rstrip("0123456789")
    if base not in LANE_KINDS:
        raise ValueError(f"lane {lane!r}: kind must be one of {', '.join(LANE_KINDS)}")
    return base


def lane_index(lane: str) -> int:
    """The number of a lane of its kind: `nvme1` -> 1 (the drive), `gpu` -> 0."""
    kind = lane_kind(lane)
    return int(lane[len(kind) :] or 0)


class Role(StrEnum):
    """What an operand is to its op where the op's kind has optional operands: an interpreter
    tells the variants apart by these, never by a unit number or an operand count."""

    MAIN = "main"  # the operands every op of the kind has (the order its kind documents)
    TOKENS = "tokens"  # the step's token ids and labels: the embedding's fwd writes, its bwd reads
    TAPE = "tape"  # a layer's autograd tape, written by a forward that keeps it for its bwd
    TIED = "tied"  # the embedding's weights (read) and gradients (written) of a tied LM head
    FEED = (
        "feed"  # a micro-batch as the driver staged it in host RAM: the embedding's fwd uploads it
    )
    LOSS = "loss"  # the step's loss on the GPU: the loss op adds its micro-batch's into it
    HOST_LOSS = "host_loss"  # the host copy of the step's loss, written at its last micro-batch
