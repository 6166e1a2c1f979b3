"""Measure this machine's rates the way the executor uses them, for `slide calibrate`.

Each probe returns a figure in base units (FLOP/s, bytes/s, elements/s) with a short note of how
it was measured; `slide calibrate` turns them into a machine profile. GPU work is timed with CUDA
events after warm-up (median of repeats); CPU work with the host clock. Sizes are chosen so the
whole run stays under ~3 minutes on one H200 host.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from executor.adam import AdamWConfig, HostScratch, Part, StepHp, update_device, update_host
from executor.buffers import HostMemory, OptState
from slide.fileio import fsync_path
from slide_ir.ir.graph import Attention
from slide_ir.planning.gpu_rates import REF_LCE, REF_TOKENS
from slide_ir.planning.shapes import linear_shapes
from slide_ir.specs.hardware_parts import format_grid
from slide_ir.specs.model import ModelSpec

HostUnit = tuple[torch.Tensor, list[Part], torch.Tensor]  # gradient, state parts, output

MB = 1 << 20


@dataclass(frozen=True)
class Figure:
    value: float
    note: str
    threads: int = 0  # CPU probes: the intra-op threads they ran with
    elements: int = 0  # the host-update probe: its unit's elements


@dataclass(frozen=True)
class GridFigure:
    text: str  # a grid field's form (`Gpu.gemm_grid`, `Link.h2d_grid`, ...)
    note: str
    points: int


def size_grid(seconds: Mapping[int, float], note: str) -> GridFigure:
    """A host curve's grid (`Link.h2d_grid`, `Nvme.read_grid`) from the seconds of an operation
    of each size: its rate there in GB/s."""
    points = [((b,), b / t / 1e9) for b, t in sorted(seconds.items())]
    return GridFigure(format_grid(points), note, len(points))


def cuda_median(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Seconds per call: CUDA events around each call, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _host_median(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- GPU ----------------------------------------------------------------------------------------
def matmul_rate(model: ModelSpec, tokens: int = REF_TOKENS) -> Figure:
    """A whole layer's GEMMs as the executor runs them (q, k, v in one; gate and up in one),
    forward and both backward products, BF16: at llama-3.1-8b and 8192 tokens, the reference
    shapes of the cost model's GEMM curve (`slide_ir.planning.gpu_rates`)."""
    h, i, q, kv = model.hidden_size, model.intermediate_size, model.q_dim, model.kv_dim
    flops = seconds = 0.0
    for out_f, in_f in linear_shapes(h, i, q, kv):
        x = torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(tokens, out_f, device="cuda", dtype=torch.bfloat16)
        for fn in (lambda: x @ w.t(), lambda: dy @ w, lambda: dy.t() @ x):  # noqa: B023
            seconds += cuda_median(fn)
            flops += 2.0 * tokens * out_f * in_f
    return Figure(
        flops / seconds,
        f"{model.name} layer GEMMs (fused qkv, gate_up) fwd+bwd, {tokens} tokens, bf16",
    )


def attention_seconds(a: Attention, repeats: int = 10, warmup: int = 2) -> float:
    """Causal SDPA forward + backward at `a`, BF16."""
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return cuda_median(step, repeats=repeats, warmup=warmup)


def attention_flops(a: Attention) -> float:
    """FLOPs as the cost model counts them: causal pairs s^2 / 2, backward = 2 x forward."""
    return 3 * 2 * 2 * a.batch * a.heads * a.seq * a.seq / 2 * a.head_dim


def attention_rate(model: ModelSpec, batch: int = 4, seq: int = 2048) -> Figure:
    """Causal SDPA forward + backward at the model's heads and head dim."""
    a = Attention(batch=batch, heads=model.num_heads, seq=seq, head_dim=model.head_dim)
    shape = (batch, model.num_heads, seq, model.head_dim)
    return Figure(attention_flops(a) / attention_seconds(a), f"SDPA causal fwd+bwd, {shape}, bf16")


def hbm_rate(size_mb: int = 2048) -> Figure:
    src = torch.empty(size_mb * MB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_median(lambda: dst.copy_(src))
    return Figure(
        2 * src.numel() / seconds, f"device-to-device copy of {size_mb} MiB (read + write)"
    )


def lce_rate(model: ModelSpec, tokens: int = REF_LCE["tokens"]) -> Figure:
    """Our fused linear cross-entropy, forward + backward (GEMMs included), at the model's
    hidden size and vocabulary in the reference chunks (`gpu_rates.REF_LCE`): logits (tokens
    x vocab) per second."""
    from kernels import fused_linear_cross_entropy

    def leaf(*shape: int) -> torch.Tensor:
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02
        return t.requires_grad_()

    h, w = leaf(tokens, model.hidden_size), leaf(model.vocab_size, model.hidden_size)
    labels = torch.randint(0, model.vocab_size, (tokens,), device="cuda")

    def step() -> None:  # as the executor's loss: gradients added into preset .grad buffers
        fused_linear_cross_entropy(h, w, labels, chunk_size=REF_LCE["chunk"]).backward()

    seconds = cuda_median(step, repeats=5)
    return Figure(
        tokens * model.vocab_size / seconds,
        f"{model.name} fused LCE fwd+bwd, {tokens} tokens x {model.vocab_size} vocab, bf16",
    )


def elementwise_rate(model: ModelSpec, tokens: int = 16384) -> Figure:
    """One decoder layer's memory-bound kernels (two RMSNorms, RoPE, SwiGLU, two residual
    adds), forward + backward through autograd, priced the way the cost model counts them:
    `ModelSpec.layer_elementwise_bytes` for the forward, twice that for the backward."""
    from executor.layers import make_rope
    from kernels import rms_norm, rope, swiglu

    m, dev, bf16 = model, "cuda", torch.bfloat16

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=bf16).requires_grad_()

    x, y = leaf(tokens, m.hidden_size), leaf(tokens, m.hidden_size)
    norm_w = torch.ones(m.hidden_size, device=dev, dtype=bf16, requires_grad=True)
    q = leaf(1, m.num_heads, tokens, m.head_dim)
    k = leaf(1, m.num_kv_heads, tokens, m.head_dim)
    gate, up = leaf(tokens, m.intermediate_size), leaf(tokens, m.intermediate_size)
    tables = make_rope(m, tokens, torch.device(dev), bf16)

    def step() -> None:
        outs = [
            rms_norm(x, norm_w, m.rms_norm_eps),
            rms_norm(y, norm_w, m.rms_norm_eps),
            *rope(q, k, tables.cos, tables.sin),
            swiglu(gate, up),
            x + y,
            y + x,
        ]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    seconds = cuda_median(step, repeats=5)
    return Figure(
        3 * m.layer_elementwise_bytes(1, tokens) / seconds,
        f"{m.name} layer norms, RoPE, SwiGLU, residuals fwd+bwd, {tokens} tokens, bf16",
    )


def gpu_adam_rate(elements: int = 64 * MB) -> Figure:
    """The executor's device AdamW (`executor.adam.update_device`) on one unit: BF16 grads in,
    FP32 master and moments, BF16 weights out."""

    state = OptState(
        master=torch.rand(elements, device="cuda"),
        m=torch.zeros(elements, device="cuda"),
        v=torch.zeros(elements, device="cuda"),
    )
    grad = torch.rand(elements, device="cuda").to(torch.bfloat16)
    weights = torch.empty(elements, device="cuda", dtype=torch.bfloat16)
    grad32, step_t = torch.empty(elements, device="cuda"), torch.zeros((), device="cuda")
    hp = StepHp(step=1, lr=1e-4, config=AdamWConfig(lr=1e-4, weight_decay=0.01))
    layout = _WholeBuffer(elements)
    seconds = cuda_median(
        lambda: update_device(layout, weights, grad, state, hp, step_t, grad32),
        repeats=5,
    )
    return Figure(elements / seconds, f"executor device AdamW, {elements / 1e6:.0f}M elements")


def dispatch_floors(
    model: ModelSpec, tokens: int = 16, repeats: int = 20, device: str = "cuda"
) -> dict[str, Figure]:
    """The host's time to issue a decoder layer's forward (as the `fwd` op runs it: no autograd)
    and its backward (as `bwd`, from a taped forward), and the loss's forward and backward, at
    `model`'s shapes and `tokens` tokens: so little GPU work that the host's dispatch (Python,
    autograd, Triton and CUDA launches) is the whole time. Seconds each (`device` "cpu": the
    same calls, for the tests)."""
    from executor.layers import decoder_layer, head_loss, make_rope
    from executor.layout import layer_layout

    dev, bf16 = torch.device(device), torch.bfloat16
    sync = torch.cuda.synchronize if dev.type == "cuda" else lambda: None
    layer = layer_layout(model, 1)
    weights = torch.randn(layer.numel, device=dev, dtype=bf16) * 0.02
    norm = torch.ones(model.hidden_size, device=dev, dtype=bf16)
    lm = torch.randn(model.vocab_size, model.hidden_size, device=dev, dtype=bf16) * 0.02
    rope = make_rope(model, tokens, dev, bf16)
    x = torch.randn(1, tokens, model.hidden_size, device=dev, dtype=bf16)
    labels = torch.randint(0, model.vocab_size, (1, tokens), device=dev)
    out = torch.empty_like(x)

    def leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
        return [t.detach().requires_grad_() for t in tensors]

    def fwd(_: object) -> None:
        with torch.no_grad():
            decoder_layer(x, layer.views(weights), model, rope, out=out)

    def taped() -> tuple[torch.Tensor, list[torch.Tensor]]:
        views = layer.views(weights)
        inputs = leaves(x, *views.values())
        return decoder_layer(
            inputs[0], dict(zip(views, inputs[1:], strict=True)), model, rope
        ), inputs

    def bwd(tape: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
        torch.autograd.backward(tape[0], torch.ones_like(tape[0]), inputs=tape[1])

    def loss(_: object) -> None:
        inputs = leaves(x, norm, lm)
        value = head_loss(*inputs, labels, eps=model.rms_norm_eps, scale=1.0, chunk=None)
        value.backward(inputs=inputs)

    def host_median(run: Callable[[object], object], prepare: Callable[[], object]) -> float:
        times = []
        for _ in range(repeats + 2):  # the first two warm up
            arg = prepare()
            sync()
            t0 = time.perf_counter()
            run(arg)
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[2:])

    how = f"{model.name} at 1 x {tokens} tokens, host clock around the op and a synchronize"
    return {
        "fwd": Figure(host_median(fwd, lambda: None), f"{how}: a decoder layer's no-grad forward"),
        "bwd": Figure(host_median(bwd, taped), f"{how}: a decoder layer's backward"),
        "loss": Figure(host_median(loss, lambda: None), f"{how}: final norm + fused LCE fwd+bwd"),
    }


# -- host link ------------------------------------------------------------------------------------
# The copy curve's sizes (`Link.h2d_grid`, `d2h_grid`) below the link probe's own: latency-bound,
# halfway and nearly at the rate (`slide_ir.planning.host_rates`); ~10 ms of copies in all.
COPY_GRID = (64 << 10, 1 << 20, 16 << 20)


def link_rates(size_mb: int = 1024, grid: Sequence[int] = COPY_GRID) -> dict[str, Any]:
    """Pinned and pageable copies of `size_mb` each way and both at once, and the pinned copy
    curves: `grid`'s sizes (prefixes of the same buffers) and `size_mb` itself."""
    n = size_mb * MB
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(n, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pinned2 = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.uint8)
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(up):
            dev.copy_(pinned, non_blocking=True)
        with torch.cuda.stream(down):
            pinned2.copy_(dev2, non_blocking=True)
        up.synchronize()
        down.synchronize()

    note = f"{size_mb} MiB copies"

    def pageable_up() -> None:
        dev.copy_(pageable)
        torch.cuda.synchronize()

    def upload_s(b: int) -> float:
        return cuda_median(lambda: dev[:b].copy_(pinned[:b], non_blocking=True))

    def download_s(b: int) -> float:
        return cuda_median(lambda: pinned[:b].copy_(dev[:b], non_blocking=True))

    ways = {"h2d": upload_s, "d2h": download_s}
    full = {way: copy(n) for way, copy in ways.items()}
    curves = {
        f"{way}_grid": size_grid(
            {b: copy(b) for b in grid if b < n} | {n: full[way]}, f"pinned {way}, each size"
        )
        for way, copy in ways.items()
    }
    return {
        **{way: Figure(n / full[way], f"pinned {way}, {note}") for way in ways},
        **curves,
        "duplex": Figure(
            n / _host_median(both), f"each way with h2d and d2h on two streams at once, {note}"
        ),
        "pageable_h2d": Figure(n / _host_median(pageable_up), f"pageable h2d, {note}"),
        "pageable_d2h": Figure(
            n / _host_median(lambda: pageable.copy_(dev)), f"pageable d2h, {note}"
        ),
    }


# -- CPU ----------------------------------------------------------------------------------------
class _WholeBuffer:
    """One weight-decayed range over the whole buffer: all `update_host` asks of a layout."""

    def __init__(self, n: int) -> None:
        self.n = n

    def decay_ranges(self) -> tuple[tuple[int, int, bool], ...]:
        return ((0, self.n, True),)


class _DmaLoad:
    """Both copy engines busy (pinned h2d and d2h, 256 MiB copies in a loop) while a CPU probe
    runs: the DRAM traffic a sliding backward puts beside the host update."""

    def __init__(self, size_mb: int = 256) -> None:
        n = size_mb * MB
        self.bufs = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.devs = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2)]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        up, down = torch.cuda.Stream(), torch.cuda.Stream()
        while not self.stop.is_set():
            with torch.cuda.stream(up):
                self.devs[0].copy_(self.bufs[0], non_blocking=True)
            with torch.cuda.stream(down):
                self.bufs[1].copy_(self.devs[1], non_blocking=True)
            up.synchronize()
            down.synchronize()

    def __enter__(self) -> _DmaLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


ADAM_UNITS = 4  # units the host-update probe walks through in turn, as a step walks its layers
ADAM_BYTES_PER_ELEMENT = 16  # FP32 master + two moments, BF16 gradient and output
ADAM_RAM_SHARE = 8  # the probe's units take at most 1/8 of the host's RAM


def host_update_unit(layer_params: int, units: int = ADAM_UNITS) -> int:
    """Elements per unit of the host-update probe: one decoder layer, shrunk so that `units` of
    them fit in 1/ADAM_RAM_SHARE of the host's RAM (a 405B layer is 3.2e9 elements: four would
    take 205 GB)."""
    fit = host_ram_bytes() // (ADAM_RAM_SHARE * units * ADAM_BYTES_PER_ELEMENT)
    return max(1, min(layer_params, fit))


def host_update_units(count: int, elements: int, memory: HostMemory) -> list[HostUnit]:
    """`count` units of `elements` as the executor holds them for the host update: FP32 master
    and moments pageable, the BF16 gradient and output from `memory` (pinned when it pins)."""

    units = []
    for _ in range(count):
        state = OptState(
            master=torch.full((elements,), 0.01), m=torch.zeros(elements), v=torch.zeros(elements)
        )
        grad = memory.empty(elements, torch.bfloat16).fill_(1e-3)
        out = memory.empty(elements, torch.bfloat16)
        units.append((grad, [Part(lo=0, hi=elements, state=state)], out))
    return units


def adam_rate(
    threads: int, elements: int = 64 * MB, *, units: int = ADAM_UNITS, under_dma: bool = False
) -> Figure:
    """The executor's own host update (`executor.adam.update_host`) run the way its `cpu` lane
    runs it: BF16 gradients in, FP32 master and moments updated in cache-sized fused chunks,
    BF16 weights cast out in the same pass (28 bytes of DRAM traffic per element); from a thread
    of its own that sets its intra-op threads (as `LaneWorker` does), over `units` units of
    `elements` each in turn (`slide calibrate` uses one decoder layer), gradients and output
    in registered pinned memory (as `HostMemory` allocates them). `under_dma`: with both copy
    engines streaming (`_DmaLoad`), as during a sliding backward.

    The thread matters most: on the H200 host (2026-11-30, `bench/host/host_update_conditions.py`)
    six 3B layers in turn with pinned gradients ran 3.19e9 elem/s from the main thread and
    2.31e9 from a thread of its own; the old probe (one 64M-element buffer, main thread) read
    2.64e9. This probe's 1.99e9 on that day's calibration lease matched the executor's steps."""

    memory = HostMemory(pin=torch.cuda.is_available())
    try:
        work = host_update_units(units, elements, memory)
        with _DmaLoad() if under_dma else contextlib.nullcontext():
            seconds = _update_seconds(work, elements, threads)
    finally:
        memory.close()
    load = ", h2d + d2h copies running" if under_dma else ""
    return Figure(
        elements / seconds,
        f"executor host AdamW (bf16 grads, fused bf16 cast) from a lane thread, {units} units of "
        f"{elements / 1e6:.0f}M elements in turn, {threads} threads{load}",
        threads,
        elements,
    )


def _update_seconds(work: list[HostUnit], elements: int, threads: int) -> float:
    """Seconds per unit of the host update over `work`'s units in turn, from a lane thread of
    its own at `threads` intra-op threads (the median of 3 passes after one)."""
    hp = StepHp(step=1, lr=1e-4, config=AdamWConfig(lr=1e-4, weight_decay=0.01))
    layout = _WholeBuffer(elements)

    def lane() -> float:
        torch.set_num_threads(threads)
        scratch = HostScratch(bf16_moments=False)

        def one_pass() -> None:
            for grad, parts, out in work:
                update_host(layout, grad, parts, out, hp, scratch)

        return _host_median(one_pass, repeats=3) / len(work)

    previous = torch.get_num_threads()
    try:
        return _in_thread(lane)
    finally:
        torch.set_num_threads(previous)


# The host update's curve (`Cpu.adam_grid`) at unit sizes below the probe's own (which the
# profile adds): a small model's layers (1M elements: its fixed cost shows) and a mid one's (8M)
ADAM_GRID = (1 << 20, 1 << 23)


def adam_grid(threads: Sequence[int], sizes: Sequence[int] = ADAM_GRID) -> GridFigure:
    """`adam_rate` at each of `sizes` and each of `threads` (the units allocated once a size):
    `Cpu.adam_grid` points, `ELEMENTSxTHREADS:GELEM/S`. At the default sizes ~0.5 s."""
    memory = HostMemory(pin=torch.cuda.is_available())
    points = []
    try:
        for n in sizes:
            work = host_update_units(ADAM_UNITS, n, memory)
            points += [((n, t), n / _update_seconds(work, n, t) / 1e9) for t in threads]
    finally:
        memory.close()
    note = f"executor host AdamW from a lane thread, {ADAM_UNITS} units in turn, each size"
    return GridFigure(format_grid(points), note, len(points))


def _in_thread(fn: Callable[[], float]) -> float:
    """fn's result, run in a new thread (its exception re-raised here)."""
    result: list[float] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=body, name="calibrate-cpu-lane")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def cast_rate(threads: int, elements: int = 64 * MB) -> Figure:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.rand(elements)
        dst = torch.empty(elements, dtype=torch.bfloat16)
        rate = elements / _host_median(lambda: dst.copy_(src))
    finally:
        torch.set_num_threads(previous)
    return Figure(rate, f"fp32 -> bf16 copy, {elements / 1e6:.0f}M elements, {threads} threads")


def host_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# -- NVMe ---------------------------------------------------------------------------------------
# The drive curve's request sizes (`Nvme.read_grid`, `write_grid`) below the probe's transfer:
# a block, a mid request, a large one (~0.1 s on a 1.5 GB/s drive)
NVME_GRID = (4 << 10, 256 << 10, 16 << 20)
REQUEST_REPEATS = 5  # requests of each size, at distinct offsets; their median is the point


def nvme_rates(
    directory: Path, size_mb: int = 2048, grid: Sequence[int] = NVME_GRID
) -> dict[str, Any]:
    """Reads and writes of one drive file through the executor's own store (kvikio on CUDA
    where it imports, O_DIRECT files otherwise), in transfers of `NVME_TRANSFER_MB`, taken in
    turn as the nvme lane takes them: read a region written earlier, overwrite another. The
    file is laid out first (two regions of `size_mb`), so every timed write overwrites, as the
    steps' writes do after set-up. On the H200 machine's disk a first write ran at 1.54 GB/s
    where the steps' overwrites ran at 2.6, and a read timed right after 4 GiB of writes ran at
    0.91-1.32 GB/s where the same lease's steps read at 1.45-1.61.

    Then the drive's request curves: requests of each of `grid`'s sizes, one at a time as the
    nvme lane issues an op's (`Nvme.read_grid`, `write_grid`, with the transfer's own point)."""
    from executor.nvme import NvmeStore, backend_for
    from executor.nvme_io import aligned_empty

    block = min(NVME_TRANSFER_MB, size_mb) * MB
    region = size_mb * MB
    transfers = range(0, region, block)
    src, dst = aligned_empty(block, torch.uint8), aligned_empty(block, torch.uint8)
    src.random_(0, 256)
    store = NvmeStore(directory, 1, {0: 2 * region}, backend=backend_for(torch.cuda.is_available()),
                      tag=f".calibrate-{os.getpid()}")  # fmt: skip
    try:
        for offset in range(0, 2 * region, block):  # lay the file out
            store.write(0, offset, src)
        fsync_path(store.paths[0])
        read_s = write_s = 0.0
        for offset in transfers:
            t0 = time.perf_counter()
            store.read(0, offset, dst)
            t1 = time.perf_counter()
            store.write(0, region + offset, src)
            read_s, write_s = read_s + t1 - t0, write_s + time.perf_counter() - t1
        t0 = time.perf_counter()
        fsync_path(store.paths[0])  # a buffered fallback's writes, before the clock stops
        write_s += time.perf_counter() - t0
        how = store.kind
        sizes = [b for b in grid if b < block]
        reads = {b: _request_s(lambda o, b=b: store.read(0, o, dst[:b]), b, region) for b in sizes}
        writes = {
            b: _request_s(lambda o, b=b: store.write(0, region + o, src[:b]), b, region)
            for b in sizes
        }
    finally:
        store.close()
    note = f"{size_mb} MiB sequential, {block // MB} MiB transfers, {how}, reads and overwrites in turn"
    count, how = len(transfers), f"one {how} request at a time, each size"
    return {
        "read": Figure(region / read_s, note),
        "write": Figure(region / write_s, note),
        "read_grid": size_grid(reads | {block: read_s / count}, how),
        "write_grid": size_grid(writes | {block: write_s / count}, how),
    }


def _request_s(request: Callable[[int], object], size: int, span: int) -> float:
    """The median seconds of `REQUEST_REPEATS` calls `request(offset)` (after one), each at its
    own `size`-aligned offset within `span` bytes (a drive's cache cannot serve one again)."""
    offsets = itertools.count(0, size)
    return _host_median(lambda: request(next(offsets) % (span - span % size)), REQUEST_REPEATS)


NVME_TRANSFER_MB = 128  # about a 3B layer's inputs at batch 16 (100 MB); a unit's state is more
