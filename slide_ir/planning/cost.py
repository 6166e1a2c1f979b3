"""CostModel: an op's physical work (FLOPs, bytes, elements) and a machine's rates -> seconds.

Roofline style, one handler per `OpKind` (a test checks the table covers every kind):

- GPU compute (fwd, recompute, bwd, loss): matmul FLOPs / achieved BF16 matmul rate + attention
  FLOPs / achieved SDPA rate + elementwise bytes / the rate our memory-bound kernels reach
  (`gpu.elementwise_bytes_per_s`, else HBM bandwidth). The three run as separate, serial
  kernels, so their times add (a roofline max would assume they overlap). The fused loss is
  priced as a whole at the measured LCE rate (`gpu.lce_logits_per_s`, logits = work.elements)
  where the profile has one;
- `gpu_adam`: elements / the measured device AdamW rate (`gpu.adam_elems_per_s`), else bytes
  touched / HBM bandwidth;
- transfers on `h2d`/`d2h`: a copy's latency + bytes / the link's *duplex* rate (each way, both
  directions busy), on the copy curve of its size (`host_rates`). The sliding schedule overlaps
  uploads with downloads during backward, where they matter most; using the duplex rate for
  every transfer is the simple, slightly pessimistic choice (the forward phase's lone uploads
  run a little faster on a real link);
- `adam`: a call's fixed cost + elements / the CPU's Adam rate at `work.bytes // work.elements`
  bytes per element (28 for FP32 weights + grads + moments: the rate is memory-bandwidth bound)
  and the plan's update threads, on the update's curve of its size (`host_rates`). The copy engines
  share that DRAM: on the H200 host full duplex traffic cost the update 20-35% of its rate
  (bench/RESULTS.md). `seconds` prices every update at full load
  (`cpu.dram_under_dma_bytes_per_s`); `seconds_under_dma` at a given share of it, which the
  simulator takes from the traffic each update actually meets;
- `cast`: elements / the CPU's FP32 -> BF16 cast rate;
- `grad_accum`: bytes touched / the CPU's DRAM bandwidth (a streaming add, memory bound);
- NVMe: a request's latency + bytes / the lane's drive rate (`nvme0` is drive 0, ...), on the
  drive's curve of the op's size, one request per op (`host_rates`);
- collectives of a data-parallel rank's graph (`slide_ir.planning.data_parallel`) on its `net` lane, when
  the model is built with `nproc` > 1 ranks on one node: ring algorithms over the GPU-to-GPU
  link (`machine.peer_bytes_per_s`: NVLink per GPU per direction, else PCIe peer-to-peer). With
  B = work.bytes (the whole message: every rank's shard), N ranks, link rate bw and a latency
  `RING_STEP_S` per ring step:

      reduce-scatter, all-gather   (N - 1) x RING_STEP_S + (N - 1) / N x B / bw
      all-reduce                   2 (N - 1) x RING_STEP_S + 2 (N - 1) / N x B / bw

  The N ranks share one host: its CPU, DRAM and drives run every rank's share of the update at
  once, so the `cpu` and `nvme` lanes' rates are the host's divided by N, and a host update
  meets N ranks' DMA traffic (its load N times one rank's, at most full duplex). Multi-node
  layout graphs price their collectives with `slide_ir.layouts.cost.LayoutCosts` instead.

Every rate is multiplied by a named efficiency factor (`Efficiency`, applied once in
`machine_rates`) that `slide calibrate` fits from measured traces; each op also pays a fixed
`launch_s` (the lane's hand-off: a kernel launch, a worker thread's wake-up) so that thousands of
tiny ops are not free, a host op its own fixed cost on its size curve (a copy's latency, a drive
request's, the update's call), and a GPU layer op takes at least the profile's floor for its kind
(`CostModel.floor`: the host's time to issue its kernels). The machine is read through attributes
only (`machine.gpu.bf16_matmul_tflops`, ...), so any object
shaped like `slide_ir.specs.hardware.Machine` works.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from slide_ir.ir.graph import Op, OpKind, Work
from slide_ir.planning.gpu_rates import REF_LCE, ShapeRates
from slide_ir.planning.host_rates import Dims, HostCurves, SizeCurve
from slide_ir.planning.machine_rates import Efficiency, resolve_rates
from slide_ir.planning.shapes import loss_gemms
from slide_ir.specs.model import LCE_BYTES_PER_LOGIT

# Latency of one ring step of an intra-node collective (a send to the next rank and its
# arrival). An estimate, not a measurement: NCCL's small-message collectives on one NVLink node
# take some microseconds per step; `slide calibrate` does not fit it yet.
RING_STEP_S = 5e-6


Handler = Callable[["CostModel", Op], float]


class CostModel:
    """(op) -> seconds for one machine. Stateless after construction."""

    __slots__ = ("efficiency", "host", "lce_factor", "machine", "nproc", "rates",
                 "rolled_back", "shapes", "threads")  # fmt: skip

    def __init__(
        self,
        machine: Any,
        *,
        cpu_threads: int | None = None,
        efficiency: Efficiency | None = None,
        nproc: int = 1,
    ) -> None:
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise ValueError(f"nproc must be a whole number >= 1, got {nproc!r}")
        self.machine = machine
        # each rank's update threads (none asked for: the executor's rule for this host,
        # `Cpu.optimizer_threads`); the host runs nproc x that many at once
        if cpu_threads is None and hasattr(machine.cpu, "optimizer_threads"):
            cpu_threads = machine.cpu.optimizer_threads(nproc)
        self.threads = cpu_threads
        host_threads = None if cpu_threads is None else cpu_threads * nproc
        self.nproc = nproc  # data-parallel ranks sharing this machine's host
        self.efficiency = efficiency or Efficiency()
        self.rates = resolve_rates(machine, host_threads, self.efficiency, nproc)
        r = self.rates
        self.shapes = ShapeRates(machine.gpu, matmul=r.flops, attention=r.attention, hbm=r.hbm)
        self.host = HostCurves(machine, cpu_threads or machine.cpu.cores)
        self.lce_factor = self._lce_factor()
        # the outcome of global clipping's conditional work priced: False, a step that needs no
        # clipping (every `REDO` finds nothing to do); True, one that rolls back
        self.rolled_back = False

    def rolling_back(self) -> CostModel:
        """These costs for a step that global clipping rolls back: every `REDO` runs."""
        other = copy.copy(self)
        other.rolled_back = True
        return other

    def seconds(self, op: Op) -> float:
        return self.efficiency.launch_s + max(HANDLERS[op.kind](self, op), self.floor(op))

    def floor(self, op: Op) -> float:
        """The host's time to issue `op`'s kernels (0 where the profile has none): a decoder
        layer's forward, recompute or backward (the ops that run attention) and the loss. At
        small shapes it, not the rates, sets the op's time: a tiny-llama layer runs in ~10 us of
        GPU time but takes ~1 ms to issue (bench/RESULTS.md)."""
        field = _FLOOR_OF.get(op.kind)
        if field is None or (op.kind != OpKind.LOSS and not op.work.attn_flops):
            return 0.0  # the embedding's and the head's other ops: a kernel or two
        return getattr(self.machine.gpu, field, None) or 0.0

    def fixed_seconds(self, op: Op) -> float:
        """The part of `seconds(op)` that no rate scales: the launch, the floor where it
        exceeds the rate's time, and a host op's fixed cost on its size curve
        (`slide_ir.planning.refit` fits rates only to the rest)."""
        fixed = self.efficiency.launch_s + max(0.0, self.floor(op) - HANDLERS[op.kind](self, op))
        if op.kind in _CURVES:
            curve, dims, _ = _CURVES[op.kind](self, op, 1.0)
            fixed += curve.fixed_seconds(dims)
        return fixed

    def binding_floor(self, op: Op) -> float:
        """`op`'s floor where it, not the rates, sets the op's time; else 0."""
        floor = self.floor(op)
        return floor if floor > HANDLERS[op.kind](self, op) else 0.0

    def seconds_under_dma(self, op: Op, dma_load: float) -> float:
        """`seconds`, with a host AdamW priced beside `dma_load` (0 to 1) of the link's full
        duplex traffic instead of all of it: the simulator re-prices each update by the
        traffic it met (`simulator.dram`)."""
        if op.kind != OpKind.ADAM:
            return self.seconds(op)
        curve, dims, rate = _adam_curve(self, op, min(1.0, dma_load * self.nproc))
        return self.efficiency.launch_s + curve.seconds(dims, rate)

    def compute_seconds(self, w: Work) -> float:
        """GPU compute: matmul, attention and elementwise kernels, serial. Each GEMM and the
        attention at the rate of its shape where the work gives it (`gpu_rates`), else at the
        profile's flat rates."""
        r = self.rates
        if w.gemms:
            matmul = sum(self.shapes.gemm_seconds(g) for g in w.gemms)
        else:
            matmul = (w.flops - w.attn_flops) / r.flops
        attention = (
            r.attention if w.attention is None else self.shapes.attention_flops_per_s(w.attention)
        )
        return matmul + w.attn_flops / attention + w.bytes / r.elementwise

    def loss_seconds(self, w: Work) -> float:
        """The fused loss: its chunks' GEMMs and logits traffic, scaled by what the profile's
        LCE rate says our kernel adds to them at the probe's shape (`lce_factor`); without
        shapes, the logits at the LCE rate."""
        if w.gemms:
            return self.lce_factor * self.compute_seconds(w)
        if self.rates.lce is not None and w.elements:
            return w.elements / self.rates.lce
        return self.compute_seconds(w)

    def _lce_factor(self) -> float:
        """Measured / modelled time of the LCE probe's shape (1 without a measured rate)."""
        if self.rates.lce is None:
            return 1.0
        ref = REF_LCE
        probe = Work(
            bytes=LCE_BYTES_PER_LOGIT * ref["tokens"] * ref["vocab"], gemms=loss_gemms(**ref)
        )
        measured = ref["tokens"] * ref["vocab"] / self.rates.lce
        return measured / self.compute_seconds(probe)

    def describe(self) -> dict[str, object]:
        """Rates as used, for a trace's `meta` (what produced these predictions)."""
        r = self.rates
        return {
            "matmul_flops_per_s": r.flops,
            "attention_flops_per_s": r.attention,
            "hbm_bytes_per_s": r.hbm,
            "elementwise_bytes_per_s": r.elementwise,
            "lce_logits_per_s": r.lce,
            "gpu_adam_elems_per_s": r.gpu_adam,
            "link_bytes_per_s": r.link,
            "adam_elems_per_s_fp32": r.adam(28, 1.0),
            "cast_elems_per_s": r.cast,
            "dram_bytes_per_s": r.dram,
            "nvme_read_bytes_per_s": list(r.nvme_read),
            "nvme_write_bytes_per_s": list(r.nvme_write),
            "cpu_threads": self.threads,
            "launch_s": self.efficiency.launch_s,
            **{f: getattr(self.machine.gpu, f, None) for f in FLOOR_FIELDS},
            # the net lane's rate and the ranks sharing the host (single-GPU traces unchanged)
            **({"peer_bytes_per_s": r.peer, "nproc": self.nproc} if self.nproc > 1 else {}),
        }


# The `Gpu` dispatch floors and the op kinds each bounds (`CostModel.floor`)
FLOOR_KINDS: Mapping[str, tuple[OpKind, ...]] = {
    "layer_fwd_floor_s": (OpKind.FWD, OpKind.RECOMPUTE),
    "layer_bwd_floor_s": (OpKind.BWD,),
    "loss_floor_s": (OpKind.LOSS,),
}
FLOOR_FIELDS = tuple(FLOOR_KINDS)
_FLOOR_OF = {kind: field for field, kinds in FLOOR_KINDS.items() for kind in kinds}


# -- handlers -----------------------------------------------------------------------------------
def _gpu_compute(cm: CostModel, op: Op) -> float:
    return cm.compute_seconds(op.work)


def _loss(cm: CostModel, op: Op) -> float:
    return cm.loss_seconds(op.work)


def _gpu_adam(cm: CostModel, op: Op) -> float:
    if cm.rates.gpu_adam is not None and op.work.elements:
        return op.work.elements / cm.rates.gpu_adam
    return op.work.bytes / cm.rates.hbm


# A host op's size curve (`host_rates`), its dims there and the rate it runs at; `dma_load`
# (0 to 1) is for the host AdamW alone (`CostModel.seconds_under_dma`).
Curve = tuple[SizeCurve, Dims, float]


def _host(cm: CostModel, op: Op) -> float:
    curve, dims, rate = _CURVES[op.kind](cm, op, 1.0)
    return curve.seconds(dims, rate)


_UPLOADS = frozenset({OpKind.H2D_PARAM, OpKind.OPT_H2D, OpKind.ACT_LOAD})


def _copy_curve(cm: CostModel, op: Op, dma_load: float) -> Curve:
    curve = cm.host.h2d if op.kind in _UPLOADS else cm.host.d2h
    return curve, (op.work.bytes,), cm.rates.link


def _adam_curve(cm: CostModel, op: Op, dma_load: float) -> Curve:
    w = op.work
    per_elem = max(1, w.bytes // w.elements) if w.bytes and w.elements else 28
    return cm.host.adam, cm.host.adam_dims(w.elements), cm.rates.adam(per_elem, dma_load)


def _cast(cm: CostModel, op: Op) -> float:
    return op.work.elements / cm.rates.cast


def _redo(cm: CostModel, op: Op) -> float:
    """Nothing but its check in a step that keeps its speculative updates; else a pass over the
    unit as the update's, its work counting the saved state restored too."""
    return _host(cm, replace(op, kind=OpKind.ADAM)) if cm.rolled_back else 0.0


def _grad_accum(cm: CostModel, op: Op) -> float:
    return op.work.bytes / cm.rates.dram


def _grad_norm(cm: CostModel, op: Op) -> float:
    """One pass over the unit's gradient where it is: GPU memory or host RAM."""
    return op.work.bytes / (cm.rates.hbm if op.lane == "gpu" else cm.rates.dram)


def _norm(cm: CostModel, op: Op) -> float:
    """A few floats per unit, summed over the ranks' shards by an all-reduce of as many."""
    exchange = 2 * (cm.nproc - 1) * RING_STEP_S
    return op.work.bytes / cm.rates.dram + exchange


def _read_curve(cm: CostModel, op: Op, dma_load: float) -> Curve:
    i = _drive(cm.rates.nvme_read, op)
    return cm.host.reads[i], (op.work.bytes,), cm.rates.nvme_read[i]


def _write_curve(cm: CostModel, op: Op, dma_load: float) -> Curve:
    i = _drive(cm.rates.nvme_write, op)
    return cm.host.writes[i], (op.work.bytes,), cm.rates.nvme_write[i]


def _drive(rates: tuple[float, ...], op: Op) -> int:
    index = int(op.lane[len("nvme") :] or 0)
    if index >= len(rates):
        raise ValueError(
            f"op {op.id}: lane {op.lane} needs NVMe drive {index}, the machine has {len(rates)}"
        )
    return index


_CURVES: Mapping[OpKind, Callable[[CostModel, Op, float], Curve]] = {
    **dict.fromkeys((OpKind.H2D_PARAM, OpKind.D2H_GRAD, OpKind.OPT_H2D, OpKind.OPT_D2H,
                     OpKind.W_D2H, OpKind.ACT_SAVE, OpKind.ACT_LOAD), _copy_curve),
    OpKind.ADAM: _adam_curve,
    OpKind.NVME_READ: _read_curve,
    OpKind.NVME_WRITE: _write_curve,
}  # fmt: skip


def ring_seconds(kind: OpKind, message: int, nproc: int, bytes_per_s: float) -> float:
    """A ring collective of `message` bytes (every rank's part together) over `nproc` ranks:
    the formulas in the module docstring. One rank: nothing to exchange, 0."""
    if nproc == 1 or message == 0:
        return 0.0
    rounds = {OpKind.REDUCE_SCATTER: 1, OpKind.ALL_GATHER: 1, OpKind.ALL_REDUCE: 2}[kind]
    steps = rounds * (nproc - 1)
    return steps * RING_STEP_S + steps / nproc * message / bytes_per_s


_RING = frozenset({OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER, OpKind.ALL_REDUCE})


def _collective(cm: CostModel, op: Op) -> float:
    if cm.nproc > 1 and op.kind in _RING:
        return ring_seconds(op.kind, op.work.bytes, cm.nproc, cm.rates.peer)
    raise ValueError(
        f"op {op.id}: a {op.kind} needs the links of a cluster; price layout graphs with "
        "slide_ir.layouts.cost.LayoutCosts"
    )


HANDLERS: Mapping[OpKind, Handler] = {
    OpKind.FWD: _gpu_compute,
    OpKind.RECOMPUTE: _gpu_compute,
    OpKind.BWD: _gpu_compute,
    OpKind.LOSS: _loss,
    OpKind.EVAL_LOSS: _loss,
    **dict.fromkeys(_CURVES, _host),  # copies, the host AdamW, drive requests: their size curves
    OpKind.GPU_ADAM: _gpu_adam,
    OpKind.CAST: _cast,
    OpKind.GRAD_ACCUM: _grad_accum,
    OpKind.GRAD_NORM: _grad_norm,
    OpKind.NORM: _norm,
    OpKind.REDO: _redo,
    OpKind.ALL_REDUCE: _collective,
    OpKind.REDUCE_SCATTER: _collective,
    OpKind.ALL_GATHER: _collective,
    OpKind.ALL_TO_ALL: _collective,
    OpKind.SEND_RECV: _collective,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class FixedCosts:
    """Seconds per op id (default for the rest): for hand-written schedules and tests."""

    seconds_by_id: Mapping[str, float] = field(default_factory=dict)
    default: float = 1.0

    def seconds(self, op: Op) -> float:
        return self.seconds_by_id.get(op.id, self.default)
