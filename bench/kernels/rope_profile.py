"""Where the time of RoPE forward + backward through autograd goes: GPU kernel time against the
host's (Python, autograd, launch) time, slide against liger, from torch.profiler.

bench/kernels/speed.py times autograd paths launched from Python, which on a slow host measures the
host; the profiler separates the two. Needs CUDA and liger-kernel.

    python -m bench.kernels.rope_profile
"""

from __future__ import annotations

import time

import torch
from liger_kernel.transformers.functional import liger_rope
from torch.profiler import ProfilerActivity, profile

import slide_kernels
from bench.kernels.speed import _outputs, memory_bound_cases


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    make = memory_bound_cases(gen)["rope"][0]
    for name, fn in (("slide", slide_kernels.rope), ("liger", liger_rope)):
        args = make()
        diff = [a.requires_grad_() for a in args[:2]]
        grads = [torch.randn_like(o) for o in _outputs(fn(*args))]

        def step(fn=fn, args=args, diff=diff, grads=grads) -> None:
            torch.autograd.grad(_outputs(fn(*args)), diff, grads)

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            step()
        torch.cuda.synchronize()
        print(f"{name}: forward + backward, wall per iteration "
              f"{(time.perf_counter() - t0) / 200 * 1e6:.0f} us", flush=True)  # fmt: skip
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main()
