"""The memory ledger: bytes per tier as closed formulas with named terms.

Each term *is* a pool of the schedule IR (equal slots on one tier), plus a human label and the
formula it came from. The planner turns terms into the Graph's pools one for one, so the ledger is
also the documentation of what an engine allocates: reserved bytes per tier == ledger peak.

Tiers for reporting: `gpu`, `cpu` (all host RAM: pinned + pageable) and `nvme`.

Units of the sliding schedule ("layers" in op ids): 0 = embedding, 1..n = decoder layers,
n+1 = head (final norm + untied LM head). `resident` units live whole on the GPU; `streamed`
units slide, but their AdamW runs on the GPU: their FP32 master and moments sit in pinned RAM
and visit a GPU staging ring around the update.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from slide_ir.ir.drives import act_pool, saved_per_drive
from slide_ir.ir.graph import Dtype, Pool, Tier
from slide_ir.ir.graph import PoolRole as R
from slide_ir.planning.zero_offload import (
    BUCKET_POOL,
    WHOLE_POOL,
    grad_buckets,
    largest_param,
    whole_slot_elements,
)
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

GIB = 1 << 30
# CUDA context, cuBLAS/cuDNN workspaces and allocator slack: typical for torch on one GPU.
CUDA_CONTEXT_BYTES = 3 * GIB // 4
# Host process: Python, torch and CUDA host libraries, data batches. Measured on the H200 machine
# (2026-11-29, llama-3.2-3b, resident runs): RSS less the planned host buffers, 1.5-2.3 GiB.
HOST_RUNTIME_BYTES = 2 * GIB
BF16 = 2
FP32 = 4
REPORT_TIERS = ("gpu", "cpu", "nvme")


@dataclass(frozen=True, kw_only=True, slots=True)
class Term:
    pool: Pool
    label: str  # what a user reads: "fp32 master weights"
    formula: str  # how it was computed: "4 B x 7.50e9 params"

    @property
    def bytes(self) -> int:
        return self.pool.bytes

    @property
    def report_tier(self) -> str:
        return "cpu" if self.pool.tier in (Tier.CPU, Tier.PINNED) else str(self.pool.tier)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ledger:
    schedule: str
    terms: tuple[Term, ...]
    gpu_capacity: int
    cpu_capacity: int
    nvme_capacity: int
    resident: tuple[int, ...] = ()  # units kept whole on the GPU
    streamed: tuple[int, ...] = ()  # sliding units updated on the GPU, state streamed

    def peak_bytes(self, tier: str) -> int:
        return sum(t.bytes for t in self.terms if t.report_tier == tier)

    def pinned_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.pool.tier == Tier.PINNED)

    def capacity_bytes(self, tier: str) -> int:
        return {"gpu": self.gpu_capacity, "cpu": self.cpu_capacity, "nvme": self.nvme_capacity}[
            tier
        ]

    def breakdown(self, tier: str) -> dict[str, int]:
        """Bytes per label (terms sharing a label are summed), largest first."""
        out: dict[str, int] = {}
        for t in self.terms:
            if t.report_tier == tier:
                out[t.label] = out.get(t.label, 0) + t.bytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def overflows(self) -> list[tuple[str, int]]:
        """(tier, bytes over capacity) for every tier that does not fit."""
        over = [(tier, self.peak_bytes(tier) - self.capacity_bytes(tier)) for tier in REPORT_TIERS]
        return [(tier, b) for tier, b in over if b > 0]

    @property
    def feasible(self) -> bool:
        return not self.overflows()

    def pools(self) -> tuple[Pool, ...]:
        return tuple(t.pool for t in self.terms)


# -- units -----------------------------------------------------------------------------------
def unit_params(model: ModelSpec, unit: int) -> int:
    """Parameters of a unit: the embedding, one decoder layer, or the head stage."""
    if unit == 0:
        return model.embedding_params
    if unit == model.num_layers + 1:
        return model.final_norm_params + model.lm_head_params
    return model.layer_params


def resident_preference(model: ModelSpec) -> tuple[int, ...]:
    """Order in which units become resident: the embedding first (its CPU update would sit at
    the step boundary, where nothing hides it), then the decoder layers whose backward comes
    last (1, 2, ...: their updates also end the step), the head last."""
    return (0, *range(1, model.num_layers + 1), model.num_layers + 1)


def adam_bytes_per_param(config: TrainConfig, *, weight_copy: bool = True) -> int:
    """Bytes one CPU AdamW step touches per parameter: FP32 master read+write, both moments read
    + write, the BF16 gradient read (twice with per-unit clipping: its norm comes first; global
    clipping's norm is its own op, `GRAD_NORM`), and the fused BF16 weight write (`weight_copy`:
    a unit whose upload is cast from the master has no copy to write)."""
    clip_read = BF16 if config.clip == "per-unit" else 0
    copy = BF16 if weight_copy else 0
    return 2 * FP32 + 2 * config.moment_bytes + BF16 + copy + clip_read


# -- building --------------------------------------------------------------------------------
# what a pool of each role holds, element by element (a pool that differs says so: `add`)
ROLE_DTYPES = {R.HIDDEN: Dtype.COMPUTE, R.HIDDEN_GRAD: Dtype.COMPUTE, R.HOST_HIDDEN: Dtype.COMPUTE,
               R.UNIT: Dtype.COMPUTE, R.DEVICE_WEIGHTS: Dtype.COMPUTE,
               R.DEVICE_GRADS: Dtype.COMPUTE, R.GRAD_LANDING: Dtype.COMPUTE,
               R.HOST_WEIGHTS: Dtype.COMPUTE, R.WEIGHT_STAGING: Dtype.COMPUTE,
               R.GRAD_ACCUM: Dtype.FP32, R.MASTER: Dtype.FP32, R.MOMENTS: Dtype.MOMENTS, R.GRAD_NORMS: Dtype.FP32, R.GRAD_SCALE: Dtype.FP32}  # fmt: skip


class _Terms:
    """Collects terms; skips empty ones so the breakdown lists only what is allocated."""

    def __init__(self) -> None:
        self.items: list[Term] = []

    def add(
        self,
        name: str,
        tier: Tier,
        slots: int,
        slot_bytes: int,
        label: str,
        formula: str,
        *,
        static: bool = False,
        role: R = R.ACCOUNTING,
        units: tuple[int, ...] = (),
        offsets: tuple[int, ...] = (),
        dtype: Dtype | None = None,
    ) -> None:
        if slots > 0 and slot_bytes > 0:
            dtype = ROLE_DTYPES.get(role, Dtype.NONE) if dtype is None else dtype
            pool = Pool(name=name, tier=tier, slots=slots, slot_bytes=slot_bytes, static=static,
                        role=role, units=units, offsets=offsets, dtype=dtype)  # fmt: skip
            self.items.append(Term(pool=pool, label=label, formula=formula))

    def add_group(
        self,
        name: str,
        tier: Tier,
        members: list[int],
        params: int,
        per_param: int,
        label: str,
        *,
        role: R,
        static: bool = True,
    ) -> None:
        """A slot per unit of a group of same-sized units (`_unit_groups`), each unit `params`
        parameters at `per_param` bytes."""
        k = len(members)
        self.add(name, tier, k, params * per_param, label,
                 f"{k} x {params:.4g} params x {per_param} B", static=static, role=role,
                 units=tuple(members))  # fmt: skip


def build_ledger(
    model: ModelSpec,
    machine: Machine,
    config: TrainConfig,
    resident: tuple[int, ...] = (),
    streamed: tuple[int, ...] = (),
) -> Ledger:
    """The ledger of `config.schedule`. `resident` and `streamed` apply to the sliding schedule
    only."""
    if config.activations == "auto":
        raise ValueError(
            "activations='auto' is chosen by the planner (slide_ir.planning.planner.plan); a ledger needs "
            "gpu, cpu or nvme"
        )
    drives = len(machine.nvme)
    if drives == 0 and "nvme" in (config.optimizer, config.activations):
        raise ValueError(
            f"optimizer='{config.optimizer}', activations='{config.activations}' need at least one "
            f"NVMe drive, and machine {machine.name!r} has none (add one with --nvme N)"
        )
    terms = _Terms()
    if config.schedule == "sliding":
        _sliding_terms(terms, model, config, resident, streamed, drives)
    elif config.schedule == "zero-offload":
        _zero_offload_terms(terms, model, config, drives)
    else:
        resident = resident_preference(model)
        _gpu_only_terms(terms, model, config, drives)
    if config.schedule != "sliding":
        streamed = ()
    return Ledger(
        schedule=config.schedule,
        terms=tuple(terms.items),
        gpu_capacity=gpu_capacity(machine, config),
        cpu_capacity=int(machine.ram_bytes * (1.0 - config.host_margin)),
        nvme_capacity=sum(d.capacity_bytes for d in machine.nvme),
        resident=tuple(sorted(resident)),
        streamed=tuple(sorted(streamed)),
    )


def gpu_capacity(machine: Machine, config: TrainConfig) -> int:
    """The GPU memory a plan may use: the GPU's, or less with `gpu_memory_gb`."""
    own = machine.gpu.memory_bytes
    if config.gpu_memory_gb is None:
        return int(own)
    return int(min(own, config.gpu_memory_gb * GIB))


def gpu_budget(machine: Machine, config: TrainConfig) -> float:
    """What "auto" choices may fill: the capacity less `gpu_margin` (allocator slack)."""
    return (1.0 - config.gpu_margin) * gpu_capacity(machine, config)


def _common_gpu_terms(
    terms: _Terms, model: ModelSpec, config: TrainConfig, flush: tuple[int, str] = (0, "")
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
    )
    terms.add("gpu_tokens", Tier.GPU, 1, 2 * b * s * 8, "token ids and labels",
              f"2 x b{b} x s{s} x 8 B", static=True, role=R.TOKENS)  # fmt: skip
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


def lce_chunk_tokens(model: ModelSpec, config: TrainConfig) -> int:
    tokens = config.batch * config.seq
    chunk = config.lce_chunk_tokens or model.default_lce_chunk_tokens(config.lce_budget_bytes)
    return min(chunk, tokens)


def _activation_terms(terms: _Terms, model: ModelSpec, config: TrainConfig, drives: int) -> None:
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
                  role=R.HIDDEN)  # fmt: skip
        return
    terms.add(
        "gpu_acts",
        Tier.GPU,
        config.act_buffers,
        hidden,
        "layer-input window",
        f"{config.act_buffers} x {what}",
        role=R.HIDDEN,
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
        )
    else:
        terms.add(
            "pinned_act_staging",
            Tier.PINNED,
            config.act_buffers,
            hidden,
            "activation NVMe staging (pinned)",
            f"{config.act_buffers} x {what}",
            role=R.HOST_HIDDEN,
        )
        for drive, k in enumerate(saved_per_drive(n, drives)):
            if k:
                terms.add(act_pool(drive), Tier.NVME, k, hidden, "saved layer inputs (NVMe)",
                          f"{k} x {what}", role=R.NVME_HIDDEN)  # fmt: skip


def _optimizer_terms(
    terms: _Terms,
    model: ModelSpec,
    config: TrainConfig,
    units: list[int],
    drives: int,
    *,
    pinned: bool = False,
) -> None:
    """FP32 master + moments of the units updated from host state: in RAM (pinned for streamed
    units, which the copy engines read), or on NVMe with a staging ring in RAM."""
    mb = config.moment_bytes
    on_nvme = 0 if pinned else {"cpu": 0, "nvme": FP32 + mb, "nvme-moments": mb}[config.optimizer]
    tier, prefix, note = (Tier.PINNED, "pinned_", " (pinned)") if pinned else (Tier.CPU, "", "")
    for group, members in _unit_groups(model, units):
        p, k = unit_params(model, members[0]), len(members)
        if config.optimizer != "nvme" or pinned:
            terms.add_group(f"{prefix}master_{group}", tier, members, p, FP32,
                            "fp32 master weights" + note, role=R.MASTER)  # fmt: skip
        if not on_nvme:
            terms.add_group(f"{prefix}moments_{group}", tier, members, p, mb,
                            "Adam moments" + note, role=R.MOMENTS)  # fmt: skip
            continue
        terms.add_group(f"nvme_opt_{group}", Tier.NVME, members, p, on_nvme,
                        "optimizer state (NVMe)", role=R.NVME_STATE)  # fmt: skip
        # Decoder layers rotate through 3 stripes per drive (one read ahead, one updating, one
        # being written); the embedding and the head are one unit each: one stripe per drive.
        depth = 3 if k > 1 else 1
        terms.add(
            f"opt_staging_{group}",
            Tier.CPU,
            depth * drives,
            -(-p * on_nvme // drives),
            "optimizer NVMe staging",
            f"{depth} x {p:.4g} params x {on_nvme} B",
            role=R.OPT_STAGING,
            units=tuple(members),
        )


def _sliding_terms(
    terms: _Terms,
    model: ModelSpec,
    config: TrainConfig,
    resident: tuple[int, ...],
    streamed: tuple[int, ...],
    drives: int,
) -> None:
    n, mb = model.num_layers, config.moment_bytes
    _common_gpu_terms(terms, model, config)
    _activation_terms(terms, model, config, drives)
    sliding = [u for u in resident_preference(model) if u not in resident]
    sliding_layers = [u for u in sliding if 1 <= u <= n]
    host_updated = [u for u in sliding if u not in streamed]
    _tape_terms(terms, model, config)
    p = model.layer_params
    units = min(config.cache_depth, len(sliding_layers))
    terms.add(
        "gpu_units",
        Tier.GPU,
        units,
        p * 2 * BF16,
        "cache units (bf16 weights+grads)",
        f"{units} x {p:.4g} params x 4 B",
        role=R.UNIT,
        units=tuple(sliding_layers),
    )
    for group, members in _unit_groups(model, [u for u in sliding if u in (0, n + 1)]):
        q = unit_params(model, members[0])
        terms.add(
            f"gpu_{group}",
            Tier.GPU,
            1,
            q * 2 * BF16,
            f"{group} slot (bf16 weights+grads)",
            f"{q:.4g} params x 4 B",
            role=R.UNIT,
            units=tuple(members),
        )
    for group, members in _unit_groups(model, list(resident)):
        terms.add_group(f"gpu_resident_{group}", Tier.GPU, members, unit_params(model, members[0]),
                        2 * BF16 + FP32 + mb, "resident layers (weights, grads, master, moments)",
                        role=R.RESIDENT)  # fmt: skip
    _streamed_staging_terms(terms, model, config, streamed)
    _handback_terms(terms, config, max((unit_params(model, u) for u in resident), default=0))
    _vocab_landing_terms(terms, model, config, [u for u in host_updated if u in (0, n + 1)])
    host_layers = sum(1 for u in host_updated if 1 <= u <= n)
    if host_layers:
        g = landing_buffers(config, host_layers, gpu_updated=bool(streamed or resident))
        terms.add(
            "pinned_grads_layers",
            Tier.PINNED,
            g,
            p * BF16,
            "gradient landing (pinned)",
            f"{g} x {p:.4g} params x 2 B",
            role=R.GRAD_LANDING,
            units=tuple(u for u in host_updated if 1 <= u <= n),
        )
    cast = cast_units(config, host_updated)
    for group, members in _unit_groups(model, [u for u in sliding if u not in cast]):
        terms.add_group(f"pinned_bf16_{group}", Tier.PINNED, members,
                        unit_params(model, members[0]), BF16, "bf16 weights (pinned)",
                        role=R.HOST_WEIGHTS)  # fmt: skip
    _weight_ring_terms(terms, model, cast)
    _grad_accum_terms(terms, model, config, sliding)
    _global_clip_terms(terms, model, config)
    _optimizer_terms(terms, model, config, host_updated, drives)
    _rollback_terms(terms, model, config, host_updated)
    _optimizer_terms(terms, model, config, list(streamed), drives, pinned=True)
    _host_terms(terms)


# slots of the weight-staging ring: one being cast while the one before it is uploaded
WEIGHT_RING_SLOTS = 2


def cast_units(config: TrainConfig, host_updated: list[int]) -> list[int]:
    """The host-updated units whose uploads are cast from the master into the weight ring
    (`TrainConfig.host_weights`, "auto" as "cast": the smallest footprint): those with the
    master in RAM (on NVMe it is in RAM only around the update, which writes their pinned
    copy instead)."""
    if config.host_weights == "pinned" or config.optimizer == "nvme":
        return []
    return host_updated


def _weight_ring_terms(terms: _Terms, model: ModelSpec, units: list[int]) -> None:
    """The pinned ring the casts of `units` fill and their uploads read, a slot the size of
    the largest of them (`slide_ir.planning.weight_ring`)."""
    largest = max((unit_params(model, u) for u in units), default=0)
    k = WEIGHT_RING_SLOTS
    terms.add("pinned_weight_ring", Tier.PINNED, k, largest * BF16,
              "bf16 weight staging ring (pinned)",
              f"{k} x {largest:.4g} params (the largest unit) x 2 B", role=R.WEIGHT_STAGING, units=tuple(units))  # fmt: skip


def _tape_terms(terms: _Terms, model: ModelSpec, config: TrainConfig) -> None:
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


def _grad_accum_terms(
    terms: _Terms, model: ModelSpec, config: TrainConfig, units: list[int]
) -> None:
    """FP32 accumulators on the host for the gradients of several micro-batches."""
    if config.grad_accum == 1:
        return
    for group, members in _unit_groups(model, units):
        terms.add_group(f"grad_accum_{group}", Tier.CPU, members, unit_params(model, members[0]),
                        FP32, "fp32 gradient accumulators", role=R.GRAD_ACCUM)  # fmt: skip


# the most parameter tensors a unit has (a decoder layer with every bias and q/k norms: 13)
MAX_UNIT_TENSORS = 16


def _global_clip_terms(terms: _Terms, model: ModelSpec, config: TrainConfig) -> None:
    """Global clipping's norms: each unit's per-parameter gradient norms where its `GRAD_NORM`
    leaves them, and the step's scale and norm that `NORM` writes for the updates."""
    if not config.deferred_updates:
        return
    units = list(resident_preference(model))
    terms.add_group("pinned_grad_norms", Tier.PINNED, units, MAX_UNIT_TENSORS, FP32,
                    "gradient norms per parameter (fp32)", role=R.GRAD_NORMS)  # fmt: skip
    terms.add("pinned_grad_scale", Tier.PINNED, 1, 2 * FP32, "clip scale and global norm",
              "2 x 4 B", static=True, role=R.GRAD_SCALE)  # fmt: skip


def speculated_units(model: ModelSpec, config: TrainConfig, host_updated: list[int]) -> list[int]:
    """The host-updated units whose updates speculate (`TrainConfig.speculate`): the first
    `config.speculated` to land, head first and the embedding last, as the backward lands
    them. Only with the state in RAM (a rollback of NVMe stripes would cost a drive pass)."""
    if config.optimizer != "cpu":
        return []
    landing = [u for u in sorted(host_updated, reverse=True) if unit_params(model, u)]
    return landing[: config.speculated]


def _rollback_terms(
    terms: _Terms, model: ModelSpec, config: TrainConfig, host_updated: list[int]
) -> None:
    """A speculated unit's master and moments as they were before its update, kept until the
    norm validates it (`slide_ir.planning.speculation`)."""
    units = speculated_units(model, config, host_updated)
    for group, members in _unit_groups(model, units):
        terms.add_group(f"rollback_{group}", Tier.CPU, members, unit_params(model, members[0]),
                        FP32 + config.moment_bytes, "state before a speculative update",
                        role=R.ROLLBACK)  # fmt: skip


def _vocab_landing_terms(
    terms: _Terms, model: ModelSpec, config: TrainConfig, units: list[int]
) -> None:
    """Pinned landing for the host-updated embedding and head (the vocab-sized units). Their
    gradients come down at the two ends of the backward: the head's first, its update done
    (on the `cpu` lane, first of the step's) while the decoder layers' backward runs, the
    embedding's last. So both share one slot the size of the larger (`pinned_grads_vocab`): the
    embedding's download waits for the head's update to free it, the ring reuse of the
    graph. Under deferred updates (global clipping) every gradient waits for the norm in a
    buffer of its own, and each keeps its own slot. 8B: 2 x 5.25e8 x 2 B = 2.10 GB -> 1.05 GB."""
    groups = list(_unit_groups(model, units))
    if len(groups) > 1 and not config.deferred_updates:
        groups = [("vocab", units)]
    for group, members in groups:
        q = max(unit_params(model, u) for u in members)
        terms.add(f"pinned_grads_{group}", Tier.PINNED, 1, q * BF16,
                  "gradient landing (pinned)", f"{q:.4g} params (the largest of units "
                  f"{', '.join(map(str, members))}) x 2 B", role=R.GRAD_LANDING,
                  units=tuple(members))  # fmt: skip


def landing_pool(pools: tuple[Pool, ...] | list[Pool], unit: int) -> str:
    """The name of the sliding gradient-landing pool whose slots hold `unit`'s gradient."""
    for pool in pools:
        if pool.role == R.GRAD_LANDING and unit in pool.units:
            return pool.name
    raise ValueError(f"no gradient landing pool holds unit {unit}")


def landing_buffers(config: TrainConfig, host_layers: int, *, gpu_updated: bool) -> int:
    """Pinned landing buffers for decoder-layer gradients (a ring). Three keep the d2h lane
    busy while the CPU updates. With units updated on the GPU (resident or streamed) the
    backward must run ahead of the CPU through the host-updated layers (the deepest ones, whose
    backward comes first) to reach them, so by default every host-updated layer gets a buffer:
    2 B/param more of pinned RAM for those layers. (8B on the H200 at batch 16 with 23 resident
    units: 2.10 s per step with 3 buffers, 1.62 s with one for each of its 10 sliding layers,
    by prediction.) With deferred updates (global clipping) every gradient waits for the norm
    in a buffer of its own, whatever `grad_buffers` asks."""
    if config.deferred_updates:
        return host_layers
    if config.grad_buffers is not None:
        return config.grad_buffers
    return max(3, host_layers) if gpu_updated else 3


def _streamed_staging_terms(
    terms: _Terms, model: ModelSpec, config: TrainConfig, streamed: tuple[int, ...]
) -> None:
    """The GPU side of streamed updates: per slot one unit's FP32 master, moments and FP32
    gradient (the update's upcast), one slot per streamed unit: the schedule moves the state
    when the link is free, so most of the step's states are on the GPU at once."""
    per = 2 * FP32 + config.moment_bytes
    for group, members in _unit_groups(model, list(streamed)):
        terms.add_group(f"gpu_opt_{group}", Tier.GPU, members, unit_params(model, members[0]),
                        per, "streamed optimizer state (fp32 master, moments, grad)",
                        role=R.STREAM_STATE, static=False)  # fmt: skip


def _zero_offload_terms(terms: _Terms, model: ModelSpec, config: TrainConfig, drives: int) -> None:
    """DeepSpeed ZeRO-2 with CPU offload (`slide_ir.planning.zero_offload`): BF16 weights on the GPU,
    gradients through one reduce bucket (and one slot for a gradient kept whole) into a pinned
    FP32 gradient buffer, master and moments on the host, a pinned BF16 copy for the upload."""
    n_all, big, bucket = model.total_params, largest_param(model), config.reduce_bucket
    # a flush casts each parameter's gradient to FP64 (its norm), then to FP32 (the copy down),
    # one parameter at a time on the compute stream, between layers: the workspace serves it
    flush = (big * 8, f", fp64 copy of the largest parameter's gradient = {big * 8 / GIB:.2f} GiB")
    _common_gpu_terms(terms, model, config, flush)
    _activation_terms(terms, model, config, drives)
    terms.add(
        "gpu_params",
        Tier.GPU,
        1,
        n_all * BF16,
        "bf16 weights",
        f"{n_all:.4g} x 2 B",
        static=True,
        role=R.DEVICE_WEIGHTS,
        units=resident_preference(model),
    )
    whole = whole_slot_elements(model, config)  # before the bucket: the executor pairs there
    # each unit's gradient at its place in the bucket (or the whole slot) it goes down in
    held = {pool: [(u, o) for b in grad_buckets(model, config) if b.pool == pool
                   for u, o in zip(b.units, b.offsets, strict=True)]
            for pool in (WHOLE_POOL, BUCKET_POOL)}  # fmt: skip
    terms.add(WHOLE_POOL, Tier.GPU, 1, whole * BF16, "gradients kept out of the bucket (bf16)",
              f"{whole:.4g} params x 2 B", static=True, role=R.DEVICE_GRADS,
              units=tuple(u for u, _ in held[WHOLE_POOL]),
              offsets=tuple(o for _, o in held[WHOLE_POOL]))  # fmt: skip
    terms.add(BUCKET_POOL, Tier.GPU, 1, bucket * BF16, "gradient reduce bucket (bf16)",
              f"reduce_bucket {bucket:.4g} x 2 B", static=True, role=R.DEVICE_GRADS,
              units=tuple(u for u, _ in held[BUCKET_POOL]),
              offsets=tuple(o for _, o in held[BUCKET_POOL]))  # fmt: skip
    terms.add("gpu_offload_staging", Tier.GPU, 1, big * BF16,
              "offload staging (largest param, bf16)", f"{big:.4g} x 2 B",
              static=True, role=R.ACCOUNTING)  # fmt: skip
    terms.add(
        "pinned_grads",
        Tier.PINNED,
        1,
        n_all * FP32,
        "fp32 gradients (pinned)",
        f"{n_all:.4g} x 4 B",
        static=True,
        role=R.GRAD_LANDING,
        dtype=Dtype.FP32,
        units=resident_preference(model),
    )
    terms.add(
        "pinned_bf16",
        Tier.PINNED,
        1,
        n_all * BF16,
        "bf16 weights (pinned)",
        f"{n_all:.4g} x 2 B",
        static=True,
        role=R.HOST_WEIGHTS,
        units=resident_preference(model),
    )
    terms.add("host_offload_staging", Tier.PINNED, 1, big * BF16,
              "offload staging (pinned)", f"{big:.4g} x 2 B",
              static=True, role=R.ACCOUNTING)  # fmt: skip
    _grad_accum_terms(terms, model, config, list(resident_preference(model)))
    _optimizer_terms(terms, model, config, list(resident_preference(model)), drives)
    _global_clip_terms(terms, model, config)
    _host_terms(terms)


def _gpu_only_terms(terms: _Terms, model: ModelSpec, config: TrainConfig, drives: int) -> None:
    """Everything on the GPU: 2+2+4+8 = 16 B per parameter plus activations (no offload)."""
    n_all, per = model.total_params, 2 * BF16 + FP32 + config.moment_bytes
    _common_gpu_terms(terms, model, config)
    _activation_terms(terms, model, config, drives)
    terms.add(
        "gpu_state",
        Tier.GPU,
        1,
        n_all * per,
        "weights, grads, master, moments",
        f"{n_all:.4g} params x {per} B",
        static=True,
        role=R.RESIDENT,
        units=resident_preference(model),
    )
    _handback_terms(terms, config, max(unit_params(model, u) for u in resident_preference(model)))
    _global_clip_terms(terms, model, config)
    _host_terms(terms)


def _handback_terms(terms: _Terms, config: TrainConfig, largest_on_gpu: int) -> None:
    """The final save reads the state a unit at a time while the run's buffers still exist
    (`slide train`: `train(on_finish=..., hand_back=False)`): a GPU-kept unit's FP32 master and
    moments pass through host RAM one unit at a time, the largest (an embedding) at most. The
    whole state gathered into RAM, as `train(hand_back=True)` does for an API caller, is not
    planned: it took RSS to 93.0 GiB after an 8B run kept entirely on the H200, whose training
    needed 4 GiB of host RAM, and it is what kept qwen2.5-14b off that 125 GiB host."""
    if largest_on_gpu:
        per = FP32 + config.moment_bytes
        terms.add(
            "host_handback",
            Tier.CPU,
            1,
            largest_on_gpu * per,
            "final save, a GPU-kept unit at a time (fp32 master + moments)",
            f"{largest_on_gpu:.4g} params (the largest GPU-kept unit) x {per} B",
            static=True,
            role=R.ACCOUNTING,
        )


def _host_terms(terms: _Terms) -> None:
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


def _unit_groups(model: ModelSpec, units: list[int]) -> Iterator[tuple[str, list[int]]]:
    """Units of equal size share a pool: embedding, decoder layers, head."""
    n = model.num_layers
    groups = {
        "embed": [u for u in units if u == 0],
        "layers": [u for u in units if 1 <= u <= n],
        "head": [u for u in units if u == n + 1],
    }
    for name, members in groups.items():
        if members and unit_params(model, members[0]) > 0:
            yield name, members


# -- data-parallel baselines -----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class StateBytes:
    """Bytes per parameter of each training state (mixed precision with FP32 master + Adam)."""

    weights: int = BF16
    grads: int = FP32
    master: int = FP32
    moments: int = 2 * FP32

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.moments


def zero_bytes_per_gpu(
    params: int, stage: int, replicas: int, sizes: StateBytes = StateBytes()
) -> int:
    """Model-state bytes per GPU under ZeRO stage 0-3 over `replicas` data-parallel GPUs
    (Rajbhandari et al. 2020): stage 1 shards the optimizer states (master + moments), stage 2
    also the gradients, stage 3 also the weights. With the default sizes (2+4+4+8 = 18 B):
    M0 = 18P, M1 = 6P + 12P/D, M2 = 2P + 16P/D, M3 = 18P/D. Activations are not included."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    opt = sizes.master + sizes.moments
    sharded = {0: 0, 1: opt, 2: opt + sizes.grads, 3: sizes.total}[stage]
    return (sizes.total - sharded) * params + -(-sharded * params // replicas)
