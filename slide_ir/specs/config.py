"""TrainConfig: what the user asks for (batch, sequence, where activations and optimizer state live).

Validated on construction: a bad value raises ValueError naming the field and the valid range, so
the planner never sees an impossible request.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Schedule(StrEnum):
    SLIDING = "sliding"  # the GPU as a sliding window over the layers
    ZERO_OFFLOAD = (
        "zero-offload"  # DeepSpeed ZeRO-2 with CPU offload (`slide_ir.planning.zero_offload`)
    )
    GPU_ONLY = "gpu-only"  # everything on the GPU: the no-offload reference


class Activations(StrEnum):
    """Where the saved layer inputs live. AUTO: chosen with the rest of the placement
    (`slide_ir.planning.placement`; on the host with placement="small")."""

    GPU = "gpu"
    CPU = "cpu"
    NVME = "nvme"
    AUTO = "auto"


class OptimizerHome(StrEnum):
    CPU = "cpu"  # FP32 master and moments in RAM
    NVME = "nvme"  # master weights and both moments on NVMe
    NVME_MOMENTS = "nvme-moments"  # only the two moments on NVMe


class MomentsDtype(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"


class HostWeights(StrEnum):
    """Where the compute-dtype weights an upload reads come from, for host-updated units
    (`slide_ir.planning.weight_ring`)."""

    # cast from the master into a small pinned ring just before each upload (SlideFormer's
    # layout: no copy of the weights beside the master); a master on NVMe is read for it
    CAST = "cast"
    PINNED = "pinned"  # a pinned copy of every unit, written by the update (2 B/param more)
    # the planner times both and keeps the faster plan that fits, cast on a tie (casts are
    # more host work: 6 B/param per upload against the update's fused 2 B); a ledger of an
    # unresolved "auto" is cast's, the smallest footprint
    AUTO = "auto"


class HeldGrads(StrEnum):
    """Where global clipping keeps the host-updated units' gradients until the step's norm is
    known (`slide_ir.planning.held_grads`)."""

    RAM = "ram"  # a pinned landing slot per host-updated unit: 2 B/param of RAM
    # written to a drive as they land, read back for their update (2 B/param there, 4 B/param
    # more drive traffic a step; the landing is a ring of 3)
    NVME = "nvme"
    # the planner times both (with the optimizer in RAM, where the machine has a drive) and
    # keeps the faster plan that fits, RAM on a tie; a ledger of an unresolved "auto" is the
    # drive's with the optimizer on NVMe (the smaller footprint), else RAM's
    AUTO = "auto"


class PlacementMode(StrEnum):
    """How "auto" choices are made."""

    # every "auto" choice (resident, streamed and sliding units, where the layer inputs live,
    # the cache depth) together, for the shortest predicted step that fits (`slide_ir.planning.placement`)
    FAST = "fast"
    SMALL = "small"  # the smallest footprint: all sliding, inputs on the host, DEFAULT_CACHE_UNITS


class Clip(StrEnum):
    NONE = "none"
    # each unit's gradient (the embedding, one decoder layer, the head) is clipped to `clip_norm`
    # by its own L2 norm, right before its update, which runs as the gradient lands
    PER_UNIT = "per-unit"
    # torch.nn.utils.clip_grad_norm_ over every parameter: the norm needs every gradient, so the
    # step's updates wait for it and run in unit order, overlapping the next forward instead of
    # the backward, or speculate and are redone where the step clips (`speculate`); a step
    # whose norm is not finite is skipped (the state untouched)
    GLOBAL = "global"


# the choices as plain strings, for command-line parsers (whose error messages show a choice's
# repr: a StrEnum member's is `<Clip.NONE: 'none'>`)
SCHEDULES = tuple(map(str, Schedule))
ACTIVATION_PLACES = tuple(map(str, (Activations.GPU, Activations.CPU, Activations.NVME)))
ACTIVATION_CHOICES = tuple(map(str, Activations))
OPTIMIZER_PLACES = tuple(map(str, OptimizerHome))
MOMENT_DTYPES = tuple(map(str, MomentsDtype))
PLACEMENTS = tuple(map(str, PlacementMode))
CLIP_MODES = tuple(map(str, Clip))
HOST_WEIGHT_MODES = tuple(map(str, HostWeights))
HELD_GRAD_PLACES = tuple(map(str, HeldGrads))
DEFAULT_CACHE_UNITS = 3
# the string choices of TrainConfig, turned into their StrEnum on construction
_ENUMS = {"schedule": Schedule, "activations": Activations, "optimizer": OptimizerHome,
          "moments_dtype": MomentsDtype, "placement": PlacementMode, "clip": Clip,
          "host_weights": HostWeights, "held_grads": HeldGrads}  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    batch: int
    seq: int
    steps: int = 3
    grad_accum: int = 1
    # the string choices below are StrEnums once constructed (`_ENUMS`; strings compare equal)
    schedule: str = Schedule.SLIDING
    activations: str = Activations.AUTO
    optimizer: str = OptimizerHome.CPU
    moments_dtype: str = MomentsDtype.FP32
    # GPU cache units for sliding decoder layers (prefetch depth + 1): a count >= 2, or "auto"
    # (chosen by the placement search; DEFAULT_CACHE_UNITS where nothing is searched)
    cache_units: int | str = "auto"
    # pinned CPU landing buffers for downloaded decoder-layer gradients; None: 3, or with
    # resident or streamed units one per host-updated layer (see `transfer_terms.landing_buffers`)
    grad_buffers: int | None = None
    # one pinned landing slot, one weight-ring slot and one NVMe staging slot per drive, each
    # shared by every host-updated unit and the size of the largest (SlideFormer's one gradient
    # and one convert buffer): the least host RAM, each copy waiting for the update or upload
    # before it. The planner's fallback where nothing else fits (`Placement.lean`)
    lean_buffers: bool = False
    act_buffers: int = 3  # GPU buffers for layer inputs in flight to/from the CPU
    # units kept whole on the GPU (weights, grads, master, moments; updated there), first in
    # `units.resident_preference` order: a count, or "auto"
    resident: int | str = "auto"
    # sliding units whose AdamW runs on the GPU, their FP32 master and moments streamed over the
    # link (up before the unit's backward, down after): a count, or "auto". See `streamed_units`.
    streamed: int | str = "auto"
    # decoder layers whose forward keeps its autograd tape on the GPU for the backward (no
    # recompute, no saved input): the top ones, last forwarded and first backwarded. A count, or
    # "auto" (chosen by the placement search; 0 where nothing is searched)
    keep_activations: int | str = "auto"
    lce_chunk_tokens: int | None = None  # None: chosen from `lce_budget_bytes`
    lce_budget_bytes: int = 1 << 29  # a chunk's bf16 logits: 2048 tokens at vocab 128256
    cpu_threads: int | None = None  # optimizer threads; None: every core
    placement: str = PlacementMode.FAST  # how "auto" choices are made
    # a cap on the GPU memory the plan may use (a shared GPU, a second job); None: the GPU's
    gpu_memory_gb: float | None = None
    gpu_margin: float = 0.05  # share of the (capped) GPU memory "auto" choices leave free
    # share of host RAM left to the OS and page cache: the ledger's CPU capacity is the rest (an
    # 8B plan at 99% of the H200 host's 125 GiB was killed by the kernel's OOM killer)
    host_margin: float = 0.05
    clip: str = Clip.NONE
    host_weights: str = HostWeights.AUTO
    held_grads: str = HeldGrads.AUTO
    clip_norm: float = 1.0
    # global clipping: the host-updated units (first to land first) whose AdamW runs as their
    # gradient lands, its state saved for a rollback, instead of waiting for the norm
    # (`slide_ir.planning.speculation`): a count, or "auto" (chosen by the planner; 0 where
    # nothing is planned)
    speculate: int | str = "auto"
    # the share of steps the planner expects global clipping to roll back (clipped or not
    # finite) when it chooses `speculate`; the session replaces it with the share it measured.
    # One in two: the 300-step chat fine-tune of bench/RESULTS.md clipped 159 of 300 steps at
    # clip_norm 1.0, and a run from random init clips every step
    rollback_share: float = 0.5
    # zero-offload: DeepSpeed's reduce_bucket_size, in elements (its default; see zero_offload)
    reduce_bucket: int = 500_000_000
    # attention masked at document boundaries (`slide train --packing documents`): SDPA runs its
    # masked kernel, which computes every (query, key) pair, at its own rate
    document_mask: bool = False

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "steps", "grad_accum"):
            _positive(name, getattr(self, name))
        for name, enum in _ENUMS.items():
            _choice(name, getattr(self, name), tuple(enum))
            object.__setattr__(self, name, enum(getattr(self, name)))
        _cache_units(self.cache_units)
        cap = self.gpu_memory_gb
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 < cap < 1e6
        ):
            raise ValueError(
                f"gpu_memory_gb must be a number of GiB > 0 (or None: the GPU's memory), "
                f"got {self.gpu_memory_gb!r}"
            )
        if self.grad_buffers is not None and self.grad_buffers < 1:
            raise ValueError(f"grad_buffers must be >= 1, got {self.grad_buffers}")
        if self.act_buffers < 3:
            raise ValueError(
                f"act_buffers must be >= 3 (input, output, one in flight), got {self.act_buffers}"
            )
        for name in ("resident", "streamed", "keep_activations", "speculate"):
            _count_or_auto(name, getattr(self, name))
        plain = (self.schedule, self.optimizer, self.grad_accum) == ("sliding", "cpu", 1)
        if isinstance(self.streamed, int) and self.streamed > 0 and not plain:
            raise ValueError(
                f"streamed={self.streamed} needs schedule 'sliding', optimizer 'cpu' and "
                f"grad_accum 1 (got '{self.schedule}', '{self.optimizer}', {self.grad_accum}); "
                "use streamed=0 or 'auto'"
            )
        if self.lce_chunk_tokens is not None:
            _positive("lce_chunk_tokens", self.lce_chunk_tokens)
        _positive("lce_budget_bytes", self.lce_budget_bytes)
        if self.cpu_threads is not None:
            _positive("cpu_threads", self.cpu_threads)
        _positive("reduce_bucket", self.reduce_bucket)
        if not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        for name in ("gpu_margin", "host_margin"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.rollback_share <= 1.0:
            raise ValueError(f"rollback_share must be in [0, 1], got {self.rollback_share}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq * self.grad_accum

    @property
    def deferred_updates(self) -> bool:
        """The step's updates wait for its global gradient norm."""
        return self.clip == Clip.GLOBAL

    def check_held_grads(self) -> None:
        """A request's `held_grads="nvme"` is one its clipping and optimizer allow (configs
        derived from it, the baselines', fall back to RAM instead)."""
        if self.held_grads == HeldGrads.NVME and self.speculate not in ("auto", 0):
            raise ValueError(
                f"held_grads='nvme' with speculate={self.speculate}: a speculated update keeps its "
                "gradient in RAM until the norm; use speculate 0 or 'auto', or held_grads 'ram'"
            )
        if self.held_grads == HeldGrads.NVME and not self.can_spill_grads:
            raise ValueError(
                "held_grads='nvme' keeps global clipping's gradients on NVMe until the norm: it "
                f"needs clip 'global', schedule 'sliding' and grad_accum 1 (got clip "
                f"'{self.clip}', schedule '{self.schedule}', grad_accum {self.grad_accum}); use "
                "'ram' or 'auto'"
            )

    @property
    def can_spill_grads(self) -> bool:
        """Global clipping's held gradients could wait on NVMe (one micro-batch: an accumulated
        gradient is summed in RAM)."""
        return self.deferred_updates and self.grad_accum == 1 and self.schedule == Schedule.SLIDING

    @property
    def may_spill_grads(self) -> bool:
        """The held gradients may go to NVMe where `held_grads` is chosen for the run: a
        speculation count asked for keeps them in RAM, where a speculated update's waits."""
        return self.can_spill_grads and self.speculate in ("auto", 0)

    @property
    def holds_landed_grads(self) -> bool:
        """Every host-updated gradient waits in its own landing slot for the norm."""
        return self.deferred_updates and not self.spills_grads

    @property
    def spills_grads(self) -> bool:
        """The held gradients wait on NVMe ("auto" unresolved: with the optimizer there)."""
        auto = self.held_grads == HeldGrads.AUTO and self.optimizer != OptimizerHome.CPU
        return self.can_spill_grads and (self.held_grads == HeldGrads.NVME or auto)

    @property
    def speculated(self) -> int:
        """Host-updated units that speculate: the count asked for, 0 for "auto", without
        global clipping or with its gradients held on NVMe."""
        if not self.deferred_updates or self.speculate == "auto" or self.spills_grads:
            return 0
        return int(self.speculate)

    @property
    def cache_depth(self) -> int:
        """GPU cache units: the count asked for, DEFAULT_CACHE_UNITS for an unresolved "auto"."""
        return DEFAULT_CACHE_UNITS if self.cache_units == "auto" else int(self.cache_units)

    @property
    def kept_tapes(self) -> int:
        """Decoder layers whose tape the forward keeps: the count asked for, 0 for "auto"."""
        return 0 if self.keep_activations == "auto" else int(self.keep_activations)

    @property
    def moment_bytes(self) -> int:
        """Bytes of both Adam moments per parameter."""
        return 8 if self.moments_dtype == "fp32" else 4


def parse_count_or_auto(name: str, text: str) -> int | str:
    """`--resident` / `--streamed` on the command line: a count or `auto`."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a count >= 0 or 'auto', got {text!r}") from None


def parse_cache_units(text: str) -> int | str:
    """`--cache-units` on the command line: a count >= 2 or `auto`."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"cache_units must be a count >= 2 or 'auto', got {text!r}") from None


def _cache_units(value: object) -> None:
    if value == "auto":
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise ValueError(
            f"cache_units must be >= 2 (one computing, one prefetching) or 'auto', got {value!r}"
        )


def _count_or_auto(name: str, value: object) -> None:
    ok = value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    if not ok:
        raise ValueError(f"{name} must be a count >= 0 or 'auto', got {value!r}")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(valid)}; got {value!r}")
