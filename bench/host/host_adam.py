"""The host AdamW of one unit: the single-pass kernel (`executor/host_adam.py`, what
`adam.update_host` runs) against the chunked torch path it replaced (`adam.update_host_torch`:
upcast, `torch._fused_adamw_`, cast), on the same buffers, with an in-place add over a large
buffer as the memory-rate yardstick.

Per unit size (a llama-3.2-3b decoder layer, 100.7M elements, and a smaller 8M-element unit),
moments dtype (FP32, BF16) and thread count (1 and all of torch's intra-op threads), it prints
the median elements/s over `REPEATS` updates after a warm-up, and bytes per element:
- `min B/el`: what one pass must move: BF16 gradient and copy (2 + 2), FP32 master read and
  written (8), moments read and written (16 FP32, 8 BF16): 28 or 20; the `save` path (a
  speculative update, the state copied for a rollback by streaming stores) writes 12 or 8 more;
- `path B/el`: what the path moves through the memory system, counting its scratch passes (the
  torch path's FP32 gradient copy, its moment upcasts and casts, the re-read of master for the
  cast; 40 or 64); its chunks are cache-sized, so part of that stays in cache;
- `GB/s`: elements/s x min B/el, against the yardstick `y += x` over two 1 GiB buffers (12 B
  per element: two reads, one write, read-modify-write like the kernel's master and moments;
  a plain copy runs slower than that on some hosts, so it would understate the bound).

    python -m bench.host.host_adam [--small-only]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch

from executor import adam, host_adam
from executor.adam import AdamWConfig, HostScratch, Part, StepHp
from executor.buffers import OptState
from executor.layout import Entry, UnitLayout

LAYER_3B = 100_663_296  # one llama-3.2-3b decoder layer
SMALL = 8_388_608
REPEATS = 5
HP = StepHp(step=3, lr=1e-4, config=AdamWConfig(lr=1e-4, weight_decay=0.01))
MIN_BYTES = {torch.float32: 28, torch.bfloat16: 20}
TORCH_PATH_BYTES = {torch.float32: 40, torch.bfloat16: 64}

Update = Callable[[], None]


def unit(n: int) -> UnitLayout:
    seg = (Entry(name="w", offset=0, shape=(n,)),)
    return UnitLayout(unit=1, segments=seg, hf=seg, decay_numel=n)


def buffers(n: int, moments: torch.dtype) -> tuple[torch.Tensor, list[Part], torch.Tensor]:
    """Gradient (BF16), one state part, the BF16 copy: as the cpu lane sees one unit."""
    state = OptState(
        master=torch.randn(n),
        m=(torch.randn(n) * 1e-3).to(moments),
        v=(torch.rand(n) * 1e-6).to(moments),
    )
    return torch.randn(n).bfloat16(), [Part(lo=0, hi=n, state=state)], torch.empty(n).bfloat16()


def median_rate(update: Update, n: int, threads: int) -> float:
    torch.set_num_threads(threads)
    update()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        update()
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def stream_rate(n: int, threads: int) -> float:
    """Bytes/s of `y += x` over `n` FP32 elements (12 bytes each: x, y read, y written)."""
    x, y = torch.ones(n), torch.zeros(n)
    return 12 * median_rate(lambda: y.add_(x), n, threads)


def paths(n: int, moments: torch.dtype) -> dict[str, Update]:
    """The updates of one unit, on the same buffers: the kernel, the kernel saving the state
    for a rollback (a speculative update), the torch path."""
    layout, (grad, parts, out) = unit(n), buffers(n, moments)
    scratch = HostScratch(bf16_moments=moments == torch.bfloat16)
    saved = OptState(master=torch.empty(n), m=torch.empty(n, dtype=moments),
                     v=torch.empty(n, dtype=moments))  # fmt: skip
    return {
        "kernel": lambda: adam.update_host(layout, grad, parts, out, HP, scratch),
        "save": lambda: adam.update_host(layout, grad, parts, out, HP, scratch, saved),
        "torch": lambda: adam.update_host_torch(layout, grad, parts, out, HP, scratch),
    }


def row(n: int, moments: torch.dtype, threads: int, name: str, rate: float, speedup: float) -> None:
    saved = 4 + 2 * moments.itemsize if name == "save" else 0  # the copy's writes
    least = MIN_BYTES[moments] + saved
    moved = least if name != "torch" else TORCH_PATH_BYTES[moments]
    print(
        f"{n:>11,} {str(moments)[6:]:>8} {threads:>3} {name:>6} {rate / 1e6:>8.1f} {least:>8} "
        f"{moved:>9} {rate * least / 1e9:>6.2f} {n / rate * 1e3:>8.1f} {speedup:>6.2f}x"
    )


def run(sizes: list[int]) -> None:
    t0 = time.perf_counter()
    assert host_adam.kernel() is not None, "host AdamW kernel did not build (see the log)"
    print(f"kernel ready in {time.perf_counter() - t0:.1f} s (compile on first use, else load)")
    all_threads = torch.get_num_threads()
    thread_counts = sorted({1, all_threads})
    print(
        f"{platform.processor() or platform.machine()}, {all_threads} intra-op threads, "
        f"ISA {host_adam.isa()}, torch {torch.__version__}"
    )
    for t in thread_counts:
        print(f"y += x, {t} thread(s): {stream_rate(1 << 28, t) / 1e9:.1f} GB/s (12 B/element)")
    print(f"{'elements':>11} {'moments':>8} {'thr':>3} {'path':>6} {'Melem/s':>8} "
          f"{'min B/el':>8} {'path B/el':>9} {'GB/s':>6} {'ms/unit':>8} {'speedup':>7}")  # fmt: skip
    for n in sizes:
        for moments in (torch.float32, torch.bfloat16):
            updates = paths(n, moments)
            for t in thread_counts:
                rates = {name: median_rate(f, n, t) for name, f in updates.items()}
                for name, r in rates.items():
                    row(n, moments, t, name, r, r / rates["torch"])
            del updates
    torch.set_num_threads(all_threads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small-only", action="store_true", help="skip the 3B-layer-sized unit")
    args = p.parse_args()
    run([SMALL] if args.small_only else [SMALL, LAYER_3B])


if __name__ == "__main__":
    main()
