"""Benchmark the kernels on the GPU against torch eager, torch.compile of the reference, and liger.

    python bench/kernels.py [--out DIR] [--quick]

- LCE, hidden 4096, vocab 128256, bf16, tokens 8192 / 32768 / 65536: forward+backward time and
  peak extra memory (max_memory_allocated during the step minus what was allocated before it;
  the returned gradients count).
- RMSNorm, RoPE, SwiGLU at Llama-3.1-8B shapes for 16 x 1024 tokens, bf16: forward and backward
  time and achieved bandwidth (the bytes each pass must read and write, over its time), against a
  device-to-device copy measured in the same run.
Times are triton.testing.do_bench medians (warm-up first); every size draws fresh inputs.
Prints a markdown table and writes it (and the raw rows as JSON) to DIR (default $OUT or ./out).
"""

import sys
from pathlib import Path

# `python bench/kernels.py` puts bench/ first on sys.path, where this file would shadow our
# `kernels` package: put the repository root there instead.
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import kernels  # noqa: E402
from kernels import reference  # noqa: E402

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
        cos, sin = kernels.rope_cos_sin(m["head_dim"], positions, 500000.0, None, dtype=bf16)
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


def bench_memory_bound(impls_by_op: dict, copy_gbs: float) -> list[dict]:
    rows = []
    gen = torch.Generator(device=DEV).manual_seed(0)
    for op, (make, n_diff, fwd_bytes, bwd_bytes) in memory_bound_cases(gen).items():
        for name, fn in impls_by_op[op].items():
            args = make()  # fresh inputs for every implementation (liger's RoPE works in place)
            diff = [a.requires_grad_() for a in args[:n_diff]]
            outs = _outputs(fn(*args))
            grads = [torch.randn_like(o) for o in outs]

            def fwd(fn=fn, args=args):
                return fn(*args)

            def fwd_bwd(fn=fn, args=args, diff=diff, grads=grads):
                torch.autograd.grad(_outputs(fn(*args)), diff, grads)

            t_fwd = do_bench(fwd, warmup=50, rep=300, return_mode="median")
            t_all = do_bench(fwd_bwd, warmup=50, rep=300, return_mode="median")
            for pass_, ms, nbytes in [("fwd", t_fwd, fwd_bytes), ("bwd", t_all - t_fwd, bwd_bytes)]:
                gbs = nbytes / ms / 1e6
                rows.append(
                    {"op": op, "pass": pass_, "impl": name, "us": ms * 1e3, "gbs": gbs,
                     "pct_copy": 100 * gbs / copy_gbs}
                )  # fmt: skip
                print(f"{op} {pass_} {name}: {ms * 1e3:.1f} us, {gbs:.0f} GB/s", flush=True)
            del args, diff, outs, grads
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
        "| op | pass | implementation | time us | GB/s | % of D2D copy |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['pass']} | {r['impl']} | {r['us']:.1f} | {r['gbs']:.0f} "
            f"| {r['pct_copy']:.0f} |"
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
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            lines.append(
                f"| {label} {name} | {setting} | {ms * 1e3:.1f} | {nbytes / ms / 1e6:.0f} |"
            )
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
    return _sweep_rows(f"rms_norm N={n}", rn, [{"TILE": t, "ELEMS_PER_THREAD": e} for t, e in
                       [(4096, 16), (4096, 8), (8192, 16), (8192, 32), (16384, 32)]],
                       {"fwd": (lambda: rn.rms_norm_forward(x, w, 1e-5), 2 * x.nbytes),
                        "bwd": (lambda: rn.rms_norm_backward(dy, x, w, rstd), 3 * x.nbytes)})  # fmt: skip


def _sweep_rope(rp, gen) -> list[str]:
    m = LLAMA_8B
    q = _hf_layout(BATCH, SEQ, m["q_heads"], m["head_dim"], gen)
    k = _hf_layout(BATCH, SEQ, m["kv_heads"], m["head_dim"], gen)
    cos, sin = kernels.rope_cos_sin(
        m["head_dim"], torch.arange(SEQ, device=DEV), 5e5, dtype=q.dtype
    )
    return _sweep_rows("rope", rp, [{"ELEMS_PER_THREAD": e} for e in (4, 8, 16, 32)],
                       {"fwd": (lambda: rp.rope_apply(q, k, cos, sin, backward=False),
                                2 * (q.nbytes + k.nbytes))})  # fmt: skip


def _sweep_lce_rows(lce, gen) -> list[str]:
    """The LCE row kernel alone on one 2048-token chunk, grads over the logits or apart."""
    rows, vocab = 2048, LCE_SHAPE["vocab"]
    logits = torch.randn(rows, vocab, device=DEV, generator=gen)
    aliased = logits.view(DTYPE)[:, :vocab]
    separate = torch.empty(rows, vocab, device=DEV, dtype=DTYPE)
    labels = torch.randint(0, vocab, (rows,), device=DEV, generator=gen)
    losses, scale = torch.empty(rows, device=DEV), torch.ones((), device=DEV)

    def launch(grad, alias):
        return lambda: lce._lce_rows_kernel[(rows,)](
            logits, grad, labels, losses, scale, vocab, logits.stride(0), grad.stride(0), -100,
            BLOCK_V=lce.BLOCK_V, ALIASED=alias, num_warps=lce.ROW_WARPS)  # fmt: skip

    return _sweep_rows("lce rows 2048", lce, [{"BLOCK_V": b, "ROW_WARPS": w} for b, w in
                       [(2048, 8), (4096, 8), (4096, 16), (8192, 16), (8192, 32)]],
                       {"aliased": (launch(aliased, True), rows * vocab * 10),
                        "separate": (launch(separate, False), rows * vocab * 10)})  # fmt: skip


def _sweep_lce_chunks(gen) -> list[str]:
    """The whole LCE at 8192 tokens for several chunk sizes: time and peak extra memory."""
    vocab, lines = LCE_SHAPE["vocab"], []
    hidden = LCE_SHAPE["hidden"]
    h = torch.randn(8192, hidden, device=DEV, generator=gen).to(DTYPE).requires_grad_()
    w = (torch.randn(vocab, hidden, device=DEV, generator=gen) / hidden**0.5).to(DTYPE)
    w.requires_grad_()
    labels = torch.randint(0, vocab, (8192,), device=DEV, generator=gen)
    for chunk in (512, 1024, 2048, 4096):

        def step(chunk=chunk):
            kernels.fused_linear_cross_entropy(h, w, labels, chunk_size=chunk).backward()

        ms = do_bench(step, warmup=50, rep=500, grad_to_none=[h, w], return_mode="median")
        h.grad = w.grad = None
        lines.append(
            f"| lce T=8192 | chunk {chunk} | {ms * 1e3:.0f} | {step_memory(step):.2f} GiB |"
        )
        h.grad = w.grad = None
    return lines


def sweep() -> list[str]:
    """Our kernels under other launch parameters (for tuning; not the results table)."""
    # modules, not the same-named functions that `kernels` exports
    lce, rn, rp, sw = (
        importlib.import_module(f"kernels.{m}") for m in ("lce", "rms_norm", "rope", "swiglu")
    )

    gen = torch.Generator(device=DEV).manual_seed(1)
    lines = ["| launch | setting | us | GB/s |", "| --- | --- | ---: | ---: |"]
    lines += _sweep_swiglu(sw, gen) + _sweep_rms_norm(rn, gen, LLAMA_8B["hidden"])
    lines += _sweep_rms_norm(rn, gen, LLAMA_8B["head_dim"])
    lines += _sweep_rope(rp, gen) + _sweep_lce_rows(lce, gen) + _sweep_lce_chunks(gen)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--quick", action="store_true", help="LCE at 8192 tokens only")
    parser.add_argument("--sweep", action="store_true", help="also time other launch settings")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    liger = liger_ops()
    compiled = {op: torch.compile(getattr(reference, op)) for op in ("rms_norm", "rope", "swiglu")}
    lce_impls = {
        "slide": kernels.fused_linear_cross_entropy,
        "torch eager": reference.linear_cross_entropy,
        "torch.compile": torch.compile(reference.linear_cross_entropy),
    }
    if "lce" in liger:
        lce_impls["liger"] = liger["lce"]
    impls_by_op = {
        op: {"slide": getattr(kernels, op), "torch eager": getattr(reference, op),
             "torch.compile": compiled[op], **({"liger": liger[op]} if op in liger else {})}
        for op in ("rms_norm", "rope", "swiglu")
    }  # fmt: skip
    copy_gbs = copy_bandwidth(2 * GIB)
    copy_small = copy_bandwidth(256 << 20)
    print(f"D2D copy: {copy_gbs:.0f} GB/s (2 GiB), {copy_small:.0f} GB/s (256 MiB)", flush=True)
    mb_rows = bench_memory_bound(impls_by_op, copy_gbs)
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
            "### Memory-bound ops: Llama-3.1-8B shapes, 16 x 1024 tokens, bf16, graph replay",
            "",
        ]
        + memory_bound_table(mb_rows)
    )
    print("\n" + text)
    if args.sweep:
        text += "\n\n### Launch-parameter sweep (slide kernels)\n\n" + "\n".join(sweep())
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
