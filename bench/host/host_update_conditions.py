"""Why the executor's host AdamW ran ~18% below calibrate's old probe: the same update
(`executor.adam.update_host`, 12 threads) timed under one condition of the `cpu` lane at a time.

- one buffer: a 64M-element unit updated again and again on the main thread (the old probe);
- layers: six llama-3.2-3b layers (100.7M elements) in turn, pageable, then with gradients and
  output pinned (registered, as the executor allocates them);
- lane thread: the same from a thread of its own that sets its intra-op threads (as the lane);
- beside a thread issuing GPU work (as the `gpu` lane), and beside both copy engines streaming.
Needs CUDA (pinned memory, the copy load).     python -m bench.host.host_update_conditions
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import torch

from executor.adam import AdamWConfig, HostScratch, StepHp, update_host
from executor.host_memory import HostMemory
from slide.calibration.host_rate_probes import HostUnit, _DmaLoad, host_update_units
from slide.calibration.probe_common import WholeBuffer

LAYER = 100_663_296  # one llama-3.2-3b decoder layer
THREADS = 12
HP = StepHp(step=3, lr=1e-4, config=AdamWConfig(lr=1e-4, weight_decay=0.01))


def rate(
    units: list[HostUnit],
    *,
    in_thread: bool,
    beside: Callable[[threading.Event], None] | None = None,
) -> float:
    """Median elements/s of one unit's update over two passes (after a warm-up pass)."""
    n = units[0][0].numel()
    times: list[float] = []

    def body() -> None:
        torch.set_num_threads(THREADS)
        scratch, layout = HostScratch(bf16_moments=False), WholeBuffer(n)
        for p in range(3):
            for grad, parts, out in units:
                t0 = time.perf_counter()
                update_host(layout, grad, parts, out, HP, scratch)  # type: ignore[arg-type]
                if p:
                    times.append(time.perf_counter() - t0)

    stop = threading.Event()
    side = threading.Thread(target=beside, args=(stop,), daemon=True) if beside else None
    if side:
        side.start()
    if in_thread:
        worker = threading.Thread(target=body)
        worker.start()
        worker.join()
    else:
        body()
    stop.set()
    if side:
        side.join()
    return n / statistics.median(times)


def gpu_lane(stop: threading.Event) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a @ a
        ev = torch.cuda.Event(blocking=True)
        ev.record()
        ev.synchronize()


def main() -> None:
    pageable, pinned = HostMemory(pin=False), HostMemory(pin=True)
    print(
        f"one 64M buffer, main thread: {rate(host_update_units(1, 64 << 20, pageable) * 4, in_thread=False):.3g} elem/s"
    )
    print(
        f"6 layers in turn, pageable: {rate(host_update_units(6, LAYER, pageable), in_thread=False):.3g}"
    )
    layers = host_update_units(6, LAYER, pinned)
    print(f"6 layers, pinned grads/out: {rate(layers, in_thread=False):.3g}")
    print(f"  ... from a lane thread: {rate(layers, in_thread=True):.3g}")
    print(f"  ... lane thread beside GPU work: {rate(layers, in_thread=True, beside=gpu_lane):.3g}")
    with _DmaLoad():
        print(f"  ... lane thread, both copy engines busy: {rate(layers, in_thread=True):.3g}")
    pinned.close()


if __name__ == "__main__":
    main()
