"""Benchmark the kernels on the GPU against torch eager, torch.compile of the reference, and liger.

    python -m bench.kernels.speed [--out DIR] [--quick] [--sweep]     (or python bench/kernels/speed.py)

- LCE, hidden 4096, vocab 128256, bf16, tokens 8192 / 32768 / 65536: forward+backward time and
  peak extra memory (max_memory_allocated during the step minus what was allocated before it;
  the returned gradients count).
- RMSNorm, RoPE, SwiGLU at Llama-3.1-8B shapes for 16 x 1024 tokens, bf16: forward and backward
  time, both wall (do_bench of the Python launch) and GPU (torch.profiler's device time, each
  call after the same idle gap, median over rounds in which the implementations take turns on
  the same input sets), and
  the achieved bandwidth (the bytes each pass must read and write, over its GPU time), against a
  device-to-device copy measured in the same run.
- Backward kernels alone (no autograd, no host): RMSNorm and RoPE, slide only.
- --sweep: slide's launch settings (the module constants, set one at a time), and the LCE's
  chunk size x logits dtype x d(weight) accumulation dtype at every LCE size (time, peak extra,
  and at 8192 tokens the gradients' error against an fp32 run, as a multiple of eager bf16's).
Times are triton.testing.do_bench medians (warm-up first); every size draws fresh inputs.
Prints markdown tables and writes them (and the raw rows as JSON) to DIR (default $OUT or ./out).
"""

import sys
from pathlib import Path

# `python bench/kernels/speed.py` puts bench/kernels/ first on sys.path: put the repository root
# there instead (`import bench.kernels...` and our `kernels` package).
REPO = Path(__file__).resolve().parents[2]
sys.path[0] = str(REPO)

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import slide_kernels  # noqa: E402
from slide_kernels import reference  # noqa: E402

GIB = 1 << 30
DEV, DTYPE = "cuda", torch.bfloat16
LCE_SHAPE = {"hidden": 4096, "vocab": 128256}
LCE_TOKENS = (8192, 32768, 65536)
LLAMA_8B = {"hidden": 4096, "inter": 14336, "q_heads": 32, "kv_heads": 8, "head_dim": 128}
BATCH, SEQ = 16, 1024


def liger_ops() -> dict:
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:
        return {}
    return {
        "lce": lf.liger_fused_linear_cross_entropy,
        "rms_norm": lambda x, w, eps: lf.liger_rms_norm(x, w, eps),
        "rope": lf.liger_rope,
        "swiglu": lf.liger_swiglu,
    }


def copy_bandwidth(nbytes: int) -> float:
    """GB/s of a device-to-device copy of nbytes, counting bytes read plus written."""
    src = torch.randn(nbytes // 2, device=DEV, dtype=DTYPE)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / ms / 1e6


# GPU idle before each timed call, as a spin kernel's cycles (~1 ms at the H200's 1.98 GHz): longer
# than any implementation's host launch path, so every call starts on an idle, settled GPU
# whatever the host costs (back to back, a faster host path made the same kernel slower:
# RMSNorm forward 66.8 us against 66.2 with a gap, 2026-11-30)
GAP_CYCLES = 2_000_000
SPIN_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel, left out of the sum


def gpu_ms(fn, iters: int = 50) -> float:
    """Milliseconds of GPU work per call of fn: the durations of the device activity (kernels,
    memsets, copies) torch.profiler records over `iters` calls, summed. Unlike do_bench's wall
    time it leaves out the host's launch path, which on a slow host can be longer than the
    kernels (RoPE's backward: 364 us wall for 88 us of kernel, 2026-11-29)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            torch.cuda._sleep(GAP_CYCLES)
            fn()
        torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    work = [e for e in device if SPIN_KERNEL not in e.name]
    if len(device) - len(work) != iters:
        raise RuntimeError(f"gpu_ms: expected {iters} {SPIN_KERNEL} events, found "
                           f"{len(device) - len(work)}")  # fmt: skip
    return sum(e.time_range.elapsed_us() for e in work) / iters / 1e3


def step_memory(step) -> float:
    """Peak bytes allocated by step() beyond what was allocated before it, in GiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / GIB


def bench_lce(impls: dict, sizes: list[int]) -> list[dict]:
    rows = []
    hidden, vocab = LCE_SHAPE["hidden"], LCE_SHAPE["vocab"]
    for n_tokens in sizes:
        gen = torch.Generator(device=DEV).manual_seed(n_tokens)
        h = torch.randn(n_tokens, hidden, device=DEV, generator=gen).to(DTYPE)
        w = (torch.randn(vocab, hidden, device=DEV, generator=gen) / hidden**0.5).to(DTYPE)
        h.requires_grad_()
        w.requires_grad_()
        labels = torch.randint(0, vocab, (n_tokens,), device=DEV, generator=gen)
        labels[torch.rand(n_tokens, device=DEV, generator=gen) < 0.05] = -100
        losses = {}
        for name, fn in impls.items():

            def step(fn=fn, h=h, w=w, labels=labels):
                loss = fn(h, w, labels)
                loss.backward()
                return loss

            h.grad = w.grad = None
            try:
                losses[name] = float(step())
                h.grad = w.grad = None
                mem = step_memory(step)
                h.grad = w.grad = None
                ms = do_bench(step, warmup=100, rep=1000, grad_to_none=[h, w], return_mode="median")
            except torch.OutOfMemoryError:
                ms = mem = float("nan")
            h.grad = w.grad = None
            torch.cuda.empty_cache()
            rows.append({"tokens": n_tokens, "impl": name, "ms": ms, "peak_gib": mem})
            print(f"lce T={n_tokens} {name}: {ms:.2f} ms, {mem:.2f} GiB", flush=True)
        ref = losses.get("torch eager")
        for row in rows[-len(impls) :]:
            row["loss_rel_diff"] = abs(losses.get(row["impl"], float("nan")) - ref) / abs(ref)
        del h, w, labels, step
        torch.cuda.empty_cache()
    return rows


def _hf_layout(batch, seq, heads, head_dim, gen):
    """(batch, heads, seq, head_dim) view of a (batch, seq, heads, head_dim) projection, as HF."""
    x = torch.randn(batch, seq, heads, head_dim, device=DEV, generator=gen)
    return x.to(DTYPE).transpose(1, 2)


def memory_bound_cases(gen) -> dict:
    """name -> (make inputs, number of differentiable inputs, bytes fwd, bytes bwd)."""
    b, s, m = BATCH, SEQ, LLAMA_8B
    bf16 = DTYPE

    def rms_inputs():
        x = torch.randn(b, s, m["hidden"], device=DEV, generator=gen).to(bf16)
        return (x, torch.rand(m["hidden"], device=DEV, generator=gen).to(bf16) + 0.5, 1e-5)

    def rope_inputs():
        q = _hf_layout(b, s, m["q_heads"], m["head_dim"], gen)
        k = _hf_layout(b, s, m["kv_heads"], m["head_dim"], gen)
        positions = torch.arange(s, device=DEV).expand(b, s)
        cos, sin = slide_kernels.rope_cos_sin(m["head_dim"], positions, 500000.0, None, dtype=bf16)
        return (q, k, cos, sin)

    def swiglu_inputs():
        return tuple(
            torch.randn(b, s, m["inter"], device=DEV, generator=gen).to(bf16) for _ in range(2)
        )

    x_bytes = b * s * m["hidden"] * 2
    qk_bytes = b * s * (m["q_heads"] + m["kv_heads"]) * m["head_dim"] * 2
    cs_bytes = 2 * b * s * m["head_dim"] * 2
    g_bytes = b * s * m["inter"] * 2
    return {
        "rms_norm": (rms_inputs, 2, 2 * x_bytes, 3 * x_bytes),
        "rope": (rope_inputs, 2, 2 * qk_bytes + cs_bytes, 2 * qk_bytes + cs_bytes),
        "swiglu": (swiglu_inputs, 2, 3 * g_bytes, 5 * g_bytes),
    }


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


GPU_ROUNDS = 3  # rounds of GPU timing; in each, every implementation runs on every input set
INPUT_SETS = 3  # equal inputs at different addresses: where a tensor sits moves an op's GPU time
# by up to 0.8 us (1.2%) at 66 us, as much as the gap between implementations (H200, 2026-11-30)


def _timed_passes(fn, args: tuple, n_diff: int):
    """(forward, forward + backward) closures over args, with output gradients drawn."""
    diff = [a.requires_grad_() for a in args[:n_diff]]
    grads = [torch.randn_like(o) for o in _outputs(fn(*args))]

    def fwd():
        return fn(*args)

    def fwd_bwd():
        torch.autograd.grad(_outputs(fn(*args)), diff, grads)

    return fwd, fwd_bwd


def bench_memory_bound(impls_by_op: dict, copy_gbs: float) -> list[dict]:
    """Wall time once per implementation. GPU time: the median over rounds in which every
    implementation runs on the same INPUT_SETS input sets in turn, so neither a drift of the
    device over the run nor where an input happens to sit favours one of them. (Liger's RoPE
    rotates its inputs in place; that changes their values, not the time.)"""
    rows = []
    gen = torch.Generator(device=DEV).manual_seed(0)
    for op, (make, n_diff, fwd_bytes, bwd_bytes) in memory_bound_cases(gen).items():
        input_sets = [make() for _ in range(INPUT_SETS)]
        passes = {
            name: [_timed_passes(fn, args, n_diff) for args in input_sets]
            for name, fn in impls_by_op[op].items()
        }
        walls = {
            name: [do_bench(f, warmup=50, rep=300, return_mode="median") for f in sets[0]]
            for name, sets in passes.items()
        }
        gpu: dict = {name: ([], []) for name in passes}
        for _ in range(GPU_ROUNDS):
            for name, sets in passes.items():
                for fs in sets:
                    for samples, f in zip(gpu[name], fs, strict=True):
                        samples.append(gpu_ms(f))
        for name in passes:
            (t_fwd, t_all), (g_fwd, g_all) = walls[name], gpu[name]
            bwd_samples = [a - f for a, f in zip(g_all, g_fwd, strict=True)]
            for pass_, ms, samples, nbytes in [
                ("fwd", t_fwd, g_fwd, fwd_bytes),
                ("bwd", t_all - t_fwd, bwd_samples, bwd_bytes),
            ]:
                g_ms = statistics.median(samples)
                gbs = nbytes / g_ms / 1e6
                rows.append(
                    {"op": op, "pass": pass_, "impl": name, "us": ms * 1e3, "gpu_us": g_ms * 1e3,
                     "gpu_us_range": (min(samples) * 1e3, max(samples) * 1e3),
                     "gpu_us_samples": [t * 1e3 for t in samples],
                     "gbs": gbs, "pct_copy": 100 * gbs / copy_gbs}
                )  # fmt: skip
                print(f"{op} {pass_} {name}: {ms * 1e3:.1f} us wall, {g_ms * 1e3:.1f} us GPU "
                      f"({min(samples) * 1e3:.1f}-{max(samples) * 1e3:.1f}), {gbs:.0f} GB/s",
                      flush=True)  # fmt: skip
        del passes, input_sets
        torch.cuda.empty_cache()
    return rows


def lce_table(rows: list[dict]) -> list[str]:
    lines = [
        "| tokens | implementation | fwd+bwd ms | x eager | peak extra GiB | % of eager's | loss rel diff |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        eager = next(r for r in rows if r["tokens"] == row["tokens"] and r["impl"] == "torch eager")
        lines.append(
            f"| {row['tokens']} | {row['impl']} | {row['ms']:.1f} | {row['ms'] / eager['ms']:.3f} "
            f"| {row['peak_gib']:.2f} | {100 * row['peak_gib'] / eager['peak_gib']:.1f} "
            f"| {row['loss_rel_diff']:.1e} |"
        )
    return lines


def memory_bound_table(rows: list[dict]) -> list[str]:
    lines = [
        "| op | pass | implementation | wall us | GPU us | GPU min-max | GB/s (GPU) | % of D2D copy |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        low, high = r.get("gpu_us_range", (r["gpu_us"], r["gpu_us"]))
        lines.append(
            f"| {r['op']} | {r['pass']} | {r['impl']} | {r['us']:.1f} | {r['gpu_us']:.1f} "
            f"| {low:.1f}-{high:.1f} | {r['gbs']:.0f} | {r['pct_copy']:.0f} |"
        )
    return lines


def paired_table(rows: list[dict], base: str = "liger") -> list[str]:
    """Slide minus `base`, sample by sample: both ran on the same input set in the same round, so
    the difference leaves out where the inputs sit and how the device drifts."""
    lines = [
        f"| op | pass | slide - {base}, median us | slide faster in |",
        "| --- | --- | ---: | ---: |",
    ]
    by_key = {(r["op"], r["pass"], r["impl"]): r for r in rows if "gpu_us_samples" in r}
    for (op, pass_, impl), row in by_key.items():
        other = by_key.get((op, pass_, base))
        if impl != "slide" or other is None:
            continue
        diffs = [a - b for a, b in zip(row["gpu_us_samples"], other["gpu_us_samples"], strict=True)]
        faster = sum(d < 0 for d in diffs)
        lines.append(
            f"| {op} | {pass_} | {statistics.median(diffs):+.2f} | {faster} of {len(diffs)} |"
        )
    return lines


def _sweep_rows(label: str, module, settings: list[dict], timed: dict) -> list[str]:
    """Time each named launch in `timed` (name -> (fn, bytes)) under each module setting."""
    defaults = {key: getattr(module, key) for key in settings[0]}
    lines = []
    for setting in settings:
        for key, value in setting.items():
            setattr(module, key, value)
        for name, (fn, nbytes) in timed.items():
            try:
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            except Exception as exc:  # a setting the compiler refuses: say so, keep sweeping
                lines.append(f"| {label} {name} | {setting} | failed: {type(exc).__name__} | |")
                continue
            lines.append(
                f"| {label} {name} | {setting} | {ms * 1e3:.1f} | {nbytes / ms / 1e6:.0f} |"
            )
            print(lines[-1], flush=True)
    for key, value in defaults.items():
        setattr(module, key, value)
    return lines


def _sweep_swiglu(sw, gen) -> list[str]:
    g, u, dy = (torch.randn(BATCH * SEQ, LLAMA_8B["inter"], device=DEV, generator=gen).to(DTYPE)
                for _ in range(3))  # fmt: skip
    return _sweep_rows("swiglu", sw, [{"BLOCK": b, "WARPS": w} for b, w in
                       [(1024, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]],
                       {"fwd": (lambda: sw.swiglu_forward(g, u), 3 * g.nbytes),
                        "bwd": (lambda: sw.swiglu_backward(dy, g, u), 5 * g.nbytes)})  # fmt: skip


def _sweep_rms_norm(rn, gen, n: int) -> list[str]:
    x = torch.randn(BATCH * SEQ * LLAMA_8B["hidden"] // n, n, device=DEV, generator=gen).to(DTYPE)
    w, dy = torch.ones(n, device=DEV, dtype=x.dtype), torch.randn_like(x)
    _, rstd = rn.rms_norm_forward(x, w, 1e-5)
    fwd = _sweep_rows(f"rms_norm N={n}", rn, [{"TILE": t, "ELEMS_PER_THREAD": e} for t, e in
                      [(4096, 16), (4096, 8), (8192, 16), (8192, 32), (16384, 32)]],
                      {"fwd": (lambda: rn.rms_norm_forward(x, w, 1e-5), 2 * x.nbytes)})  # fmt: skip
    # backward kernel + the torch sum of the partial d(weight) rows, as autograd runs it
    bwd_settings = [
        {"BWD_TILE": rn.BWD_TILE, "BWD_ELEMS_PER_THREAD": rn.BWD_ELEMS_PER_THREAD,
         "BWD_PER_SM": rn.BWD_PER_SM, "BWD_STAGES": rn.BWD_STAGES}
    ] + [
        {"BWD_TILE": t, "BWD_ELEMS_PER_THREAD": e, "BWD_PER_SM": p, "BWD_STAGES": st}
        for t in (8192, 16384, 32768) for e in (8, 16) for p in (1, 2) for st in (1, 2, 3)
    ]  # fmt: skip
    bwd = _sweep_rows(f"rms_norm N={n}", rn, bwd_settings,
                      {"bwd": (lambda: rn.rms_norm_backward(dy, x, w, rstd), 3 * x.nbytes)})  # fmt: skip
    return fwd + bwd


def _rope_inputs(gen):
    m = LLAMA_8B
    q = _hf_layout(BATCH, SEQ, m["q_heads"], m["head_dim"], gen)
    k = _hf_layout(BATCH, SEQ, m["kv_heads"], m["head_dim"], gen)
    cos, sin = slide_kernels.rope_cos_sin(
        m["head_dim"], torch.arange(SEQ, device=DEV), 5e5, dtype=q.dtype
    )
    return q, k, cos, sin


def _sweep_rope(rp, gen) -> list[str]:
    q, k, cos, sin = _rope_inputs(gen)
    dq, dk = _rope_inputs(gen)[:2]  # upstream gradients in the same strided layout
    nbytes = 2 * (q.nbytes + k.nbytes)
    return _sweep_rows("rope", rp, [{"ELEMS_PER_THREAD": e} for e in (32, 4, 8, 16, 64)],
                       {"fwd": (lambda: rp.rope_apply(q, k, cos, sin, backward=False), nbytes),
                        "bwd": (lambda: rp.rope_apply(dq, dk, cos, sin, backward=True), nbytes)})  # fmt: skip


def _sweep_lce_rows(lce, gen) -> list[str]:
    """The LCE row kernel alone on one 2048-token chunk: bf16 logits with the gradient written in
    place (the default), fp32 logits with bf16 gradients over them (aliased) or apart."""
    rows, vocab = 2048, LCE_SHAPE["vocab"]
    logits = torch.randn(rows, vocab, device=DEV, generator=gen)
    logits16 = logits.to(DTYPE)
    aliased = logits.view(DTYPE)[:, :vocab]
    separate = torch.empty(rows, vocab, device=DEV, dtype=DTYPE)
    labels = torch.randint(0, vocab, (rows,), device=DEV, generator=gen)
    losses, scale = torch.empty(rows, device=DEV), torch.ones((), device=DEV)

    def launch(src, grad, alias):
        return lambda: lce._lce_rows_kernel[(rows,)](
            src, grad, labels, losses, scale, vocab, src.stride(0), grad.stride(0), -100,
            BLOCK_V=lce.BLOCK_V, ALIASED=alias, num_warps=lce.ROW_WARPS)  # fmt: skip

    return _sweep_rows("lce rows 2048", lce, [{"BLOCK_V": b, "ROW_WARPS": w} for b, w in
                       [(lce.BLOCK_V, lce.ROW_WARPS), (2048, 4), (2048, 8), (4096, 16), (8192, 16),
                        (8192, 32)]],
                       {"bf16 in place": (launch(logits16, logits16, False), rows * vocab * 6),
                        "fp32, aliased": (launch(logits, aliased, True), rows * vocab * 10),
                        "fp32, separate": (launch(logits, separate, False), rows * vocab * 10)})  # fmt: skip


# (chunk or None for lce_chunk_size's, logits_fp32, accumulate_fp32); the first is the default
LCE_SWEEP = [(None, False, False)] + [
    (c, False, False) for c in (512, 1024, 2048, 4096)
] + [(c, lf, af) for c in (1024, 2048) for lf, af in [(True, False), (False, True)]] + [
    (2048, True, True)  # the previous design: fp32 logits, fp32 d(weight)
]  # fmt: skip


def _lce_inputs(n_tokens: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    hidden, vocab = LCE_SHAPE["hidden"], LCE_SHAPE["vocab"]
    h = torch.randn(n_tokens, hidden, device=DEV, generator=gen).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, device=DEV, generator=gen) / hidden**0.5).to(dtype)
    labels = torch.randint(0, vocab, (n_tokens,), device=DEV, generator=gen)
    labels[torch.rand(n_tokens, device=DEV, generator=gen) < 0.05] = -100
    return h, w.requires_grad_(), labels


def _grads(fn, h, w, labels) -> tuple[torch.Tensor, ...]:
    h.grad = w.grad = None
    loss = fn(h, w, labels)
    loss.backward()
    out = (loss.detach().float(), h.grad.float(), w.grad.float())
    h.grad = w.grad = None
    return out


def _rel(x: torch.Tensor, gold: torch.Tensor) -> float:
    return float((x - gold).norm() / gold.norm())


def _lce_errors(h, w, labels) -> tuple[dict, tuple[float, ...]]:
    """Gold (fp32 inputs and GEMMs, our kernel) and eager bf16's relative errors against it."""
    h32, w32 = (t.detach().float().requires_grad_() for t in (h, w))
    gold = _grads(slide_kernels.fused_linear_cross_entropy, h32, w32, labels)
    del h32, w32
    eager = _grads(reference.linear_cross_entropy, h, w, labels)
    errs = tuple(_rel(e, g) for e, g in zip(eager, gold, strict=True))
    torch.cuda.empty_cache()
    return {"gold": gold}, errs


def _lce_sweep_row(lce, h, w, labels, setting, gold: dict, eager_errs: tuple) -> str:
    """One LCE_SWEEP setting at h's token count: time, peak extra, and errors if gold is given."""
    chunk, logits_fp32, acc_fp32 = setting
    fn = functools.partial(
        slide_kernels.fused_linear_cross_entropy,
        chunk_size=chunk, logits_fp32=logits_fp32, accumulate_fp32=acc_fp32,
    )  # fmt: skip

    def step():
        fn(h, w, labels).backward()

    step()
    h.grad = w.grad = None
    ms = do_bench(step, warmup=25, rep=1000, grad_to_none=[h, w], return_mode="median")
    h.grad = w.grad = None
    peak = step_memory(step)
    errs = "-"
    if gold:
        got = _grads(fn, h, w, labels)
        errs = " / ".join(
            f"{_rel(x, g) / (e or float('nan')):.2f}"
            for x, g, e in zip(got, gold["gold"], eager_errs, strict=True)
        )
    h.grad = w.grad = None
    n_tokens, vocab = h.shape[0], w.shape[0]
    used = chunk or lce.lce_chunk_size(n_tokens, vocab, 4 if logits_fp32 else 2)
    eager_gib = n_tokens * vocab * 12 / GIB
    return (
        f"| {n_tokens} | {used}{' (auto)' if chunk is None else ''} "
        f"| {'fp32' if logits_fp32 else 'bf16'} | {'fp32' if acc_fp32 else 'bf16'} "
        f"| {ms:.1f} | {peak:.2f} | {100 * peak / eager_gib:.1f} | {errs} |"
    )


def _sweep_lce(lce) -> list[str]:
    """The whole LCE (forward + backward) under each LCE_SWEEP setting at every LCE size: time,
    peak extra (% of eager's T x V x 12 bytes), and at 8192 tokens the error of loss, d(hidden),
    d(weight) against an fp32 run, as a multiple of eager bf16's."""
    lines = [
        "| lce T | chunk | logits | d(weight) sum | ms | peak GiB | % of eager | err x eager "
        "(loss / dh / dW) |",
        "| ---: | ---: | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for n_tokens in LCE_TOKENS:
        h, w, labels = _lce_inputs(n_tokens, DTYPE, seed=n_tokens + 1)
        gold, eager_errs = _lce_errors(h, w, labels) if n_tokens == 8192 else ({}, ())
        for setting in LCE_SWEEP:
            lines.append(_lce_sweep_row(lce, h, w, labels, setting, gold, eager_errs))
            print(lines[-1], flush=True)
        if eager_errs:
            errs = " / ".join(f"{e:.1e}" for e in eager_errs)
            lines.append(f"| {n_tokens} | eager bf16 rel err vs fp32 | | | | | | {errs} |")
        del h, w, labels, gold
        torch.cuda.empty_cache()
    return lines


def sweep(ops: str = "all") -> list[str]:
    """Our kernels under other launch parameters (for tuning; not the results table); `ops` is
    "all" or "rms_norm" (the norm's settings alone: a short run)."""
    # modules, not the same-named functions that `kernels` exports
    lce, rn, rp, sw = (
        importlib.import_module(f"slide_kernels.{m}") for m in ("lce", "rms_norm", "rope", "swiglu")
    )

    gen = torch.Generator(device=DEV).manual_seed(1)
    lines = ["| launch | setting | us | GB/s |", "| --- | --- | ---: | ---: |"]
    if ops == "rms_norm":
        return lines + _sweep_rms_norm(rn, gen, LLAMA_8B["hidden"])
    lines += _sweep_swiglu(sw, gen) + _sweep_rms_norm(rn, gen, LLAMA_8B["hidden"])
    lines += _sweep_rms_norm(rn, gen, LLAMA_8B["head_dim"])
    lines += _sweep_rope(rp, gen) + _sweep_lce_rows(lce, gen)
    lines += ["", "LCE settings (the first row of each T is the default):", ""]
    return lines + _sweep_lce(lce)


def bench_kernels_alone(copy_gbs: float) -> list[dict]:
    """Slide's backward kernels by themselves, as autograd launches them (no host in the way)."""
    rn, rp = (importlib.import_module(f"slide_kernels.{m}") for m in ("rms_norm", "rope"))
    gen = torch.Generator(device=DEV).manual_seed(2)
    x = torch.randn(BATCH * SEQ, LLAMA_8B["hidden"], device=DEV, generator=gen).to(DTYPE)
    w, dy = torch.rand(x.shape[1], device=DEV, dtype=DTYPE) + 0.5, torch.randn_like(x)
    _, rstd = rn.rms_norm_forward(x, w, 1e-5)
    q, k, cos, sin = _rope_inputs(gen)
    dq, dk = _rope_inputs(gen)[:2]
    timed = {
        "rms_norm": (lambda: rn.rms_norm_backward(dy, x, w, rstd), 3 * x.nbytes),
        "rope": (lambda: rp.rope_apply(dq, dk, cos, sin, backward=True),
                 2 * (q.nbytes + k.nbytes) + cos.nbytes + sin.nbytes),
    }  # fmt: skip
    rows = []
    for op, (fn, nbytes) in timed.items():
        ms, g_ms = do_bench(fn, warmup=50, rep=300, return_mode="median"), gpu_ms(fn)
        gbs = nbytes / g_ms / 1e6
        rows.append({"op": op, "pass": "bwd", "impl": "slide, kernel alone", "us": ms * 1e3,
                     "gpu_us": g_ms * 1e3, "gbs": gbs, "pct_copy": 100 * gbs / copy_gbs})  # fmt: skip
        print(f"{op} bwd kernel alone: {ms * 1e3:.1f} us wall, {g_ms * 1e3:.1f} us GPU", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--quick", action="store_true", help="LCE at 8192 tokens only")
    parser.add_argument(
        "--sweep", nargs="?", const="all", choices=["all", "rms_norm"],
        help="also time other launch settings (all, or rms_norm only)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/kernels/speed.py needs a CUDA GPU", file=sys.stderr)
        return 2
    liger = liger_ops()
    compiled = {op: torch.compile(getattr(reference, op)) for op in ("rms_norm", "rope", "swiglu")}
    lce_impls = {
        "slide": slide_kernels.fused_linear_cross_entropy,
        "torch eager": reference.linear_cross_entropy,
        "torch.compile": torch.compile(reference.linear_cross_entropy),
    }
    if "lce" in liger:
        lce_impls["liger"] = liger["lce"]
    impls_by_op = {
        op: {"slide": getattr(slide_kernels, op), "torch eager": getattr(reference, op),
             "torch.compile": compiled[op], **({"liger": liger[op]} if op in liger else {})}
        for op in ("rms_norm", "rope", "swiglu")
    }  # fmt: skip
    copy_gbs = copy_bandwidth(2 * GIB)
    copy_small = copy_bandwidth(256 << 20)
    print(f"D2D copy: {copy_gbs:.0f} GB/s (2 GiB), {copy_small:.0f} GB/s (256 MiB)", flush=True)
    mb_rows = bench_memory_bound(impls_by_op, copy_gbs) + bench_kernels_alone(copy_gbs)
    lce_rows = bench_lce(lce_impls, LCE_TOKENS[:1] if args.quick else LCE_TOKENS)
    props = torch.cuda.get_device_properties(0)
    liger_version = "not installed"
    if liger:
        from importlib.metadata import version

        liger_version = version("liger-kernel")
    header = [
        f"Measured {datetime.date.today()} on {props.name} ({props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, triton {triton.__version__}, liger-kernel {liger_version}.",
        "",
        f"D2D copy (read + write): {copy_gbs:.0f} GB/s at 2 GiB, {copy_small:.0f} GB/s at "
        "256 MiB; percentages below are of the 2 GiB figure.",
        "",
        "### Fused linear cross-entropy: H = 4096, V = 128256, bf16, 5% ignored labels",
        "",
    ]
    text = "\n".join(
        header
        + lce_table(lce_rows)
        + [
            "",
            "### Memory-bound ops: Llama-3.1-8B shapes, 16 x 1024 tokens, bf16 (wall: do_bench of the launch from Python, host included; "
            f"GPU: the profiler's device time after a 1 ms idle gap, median over {GPU_ROUNDS} rounds "
            f"x {INPUT_SETS} input sets shared by all implementations, which the bandwidth uses)",
            "",
        ]
        + memory_bound_table(mb_rows)
        + ["", "Paired by input set and round (GPU time):", ""]
        + paired_table(mb_rows)
    )
    print("\n" + text)
    if args.sweep:
        text += "\n\n### Launch-parameter sweep (slide kernels)\n\n" + "\n".join(sweep(args.sweep))
        print(text[text.index("### Launch-parameter") :])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels_bench.md").write_text(text + "\n")
    raw = {
        "copy_gbs": copy_gbs,
        "copy_small_gbs": copy_small,
        "lce": lce_rows,
        "memory_bound": mb_rows,
    }
    (args.out / "kernels_bench.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
