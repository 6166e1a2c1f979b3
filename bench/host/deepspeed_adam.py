"""Our host AdamW kernel against DeepSpeed's CPUAdam (the kernel the SlideFormer paper uses), on
the same buffers, in `host_adam`'s row format.

DeepSpeed is used from its source distribution only, for this benchmark only: the sdist (default:
the newest `.whl/deepspeed-*.tar.gz`, git-ignored) is unpacked into a cache directory and its CPU
Adam op alone (`csrc/adam/cpu_adam.cpp`, `cpu_adam_impl.cpp`, `csrc/includes`) is JIT-built with
`torch.utils.cpp_extension.load` and the flags its `CPUOpBuilder` uses: -O3 -g -Wno-reorder
-march=native -fopenmp, -D__AVX512__ / -D__AVX256__ / -D__SCALAR__ by the CPU, -UC10_USE_GLOG;
no OpenMP link flag (as there: its OpenMP calls bind torch's runtime). Its loops take that
runtime's default thread count, so each thread count is set with `torch.set_num_threads` and
`omp_set_num_threads` in every OpenMP runtime mapped (OMP_NUM_THREADS is left alone). Nothing
of DeepSpeed is installed or imported; no CUDA is needed.

Its `adam_update(id, step, lr, beta1, beta2, eps, weight_decay, bias_correction, params, grads,
exp_avg, exp_avg_sq)` takes the gradient in the params' dtype: FP32 with an FP32 master. It has
no FP32-master/BF16-moments variant and writes no compute-dtype copy. So, FP32 moments, per unit
size and thread count, on one set of buffers (BF16 gradient and copy, FP32 master and moments):
- `kernel`, `torch`: `adam.update_host` and `adam.update_host_torch`, as in `host_adam`;
- `ds`: DeepSpeed's update alone, from an FP32 gradient made before timing (28 B/el moved:
  gradient 4, master 8, moments 16); the BF16->FP32 gradient and the BF16 copy are excluded;
- `ds+cvt`: the same job as ours: BF16 gradient cast into an FP32 buffer (`copy_`, 6 B/el),
  DeepSpeed's update, master cast into the BF16 copy (`copy_`, 6 B/el): 40 B/el.
`min B/el` and `GB/s` are the unit's job (28 B/el), as in `host_adam`; `speedup` is against
`torch`. A 1M-element parity check first shows both compute the same AdamW.

    python -m bench.host.deepspeed_adam [--sdist PATH] [--small-only]
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from bench.host import host_adam as base
from executor import adam, host_adam
from executor.adam import HostScratch

ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("csrc/adam/cpu_adam.cpp", "csrc/adam/cpu_adam_impl.cpp", "csrc/includes/")
SIMD = {"avx512": "-D__AVX512__", "avx2": "-D__AVX256__", "portable": "-D__SCALAR__"}
DS_BYTES = {"ds": 28, "ds+cvt": 40}
OPT_ID = 0
FETCH = "python3 -m pip download --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8"


class Unavailable(Exception):
    """DeepSpeed's op cannot be had; the message says what to do."""


def newest_sdist() -> Path | None:
    found = sorted((ROOT / ".whl").glob("deepspeed-*.tar.gz"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def unpack(sdist: Path) -> Path:
    """The sdist's CPU Adam sources, unpacked once into a cache directory keyed by its name."""
    if not sdist.is_file():
        raise Unavailable(f"no DeepSpeed sdist at {sdist}; fetch it with `{FETCH}`")
    stem = sdist.name.removesuffix(".tar.gz")
    dest = Path(tempfile.gettempdir()) / "slide-deepspeed-src" / stem
    if not (dest / NEEDED[1]).is_file():
        try:
            with tarfile.open(sdist) as tar:
                keep = [m for m in tar if m.name.removeprefix(f"{stem}/").startswith(NEEDED)]
                tar.extractall(dest.parent, members=keep, filter="data")
        except (tarfile.TarError, OSError) as e:
            raise Unavailable(
                f"cannot unpack {sdist} ({str(e).splitlines()[0]}); fetch it again with `{FETCH}`"
            ) from e
    if not (dest / NEEDED[1]).is_file():
        raise Unavailable(f"{sdist} holds no {stem}/{NEEDED[1]}: not a DeepSpeed sdist?")
    return dest


def build(src: Path) -> ModuleType:
    """DeepSpeed's CPU Adam op, JIT-built (or loaded from torch's extension cache)."""
    from torch.utils import cpp_extension

    host_adam._ninja_on_path()
    isa = host_adam.isa()
    tag = f"{src.name.replace('.', '_').replace('-', '_')}_{isa}_t"
    tag += torch.__version__.split("+")[0].replace(".", "_")
    flags = ["-O3", "-g", "-Wno-reorder", "-march=native", "-fopenmp", SIMD[isa], "-UC10_USE_GLOG"]
    try:
        op: ModuleType = cpp_extension.load(
            name=f"bench_{tag}",
            sources=[str(src / NEEDED[0]), str(src / NEEDED[1])],
            extra_include_paths=[str(src / NEEDED[2])],
            extra_cflags=flags,
            verbose=False,
        )
    except Exception as e:  # a compiler error, no compiler, no ninja: one line, what to do
        raise Unavailable(
            f"DeepSpeed's CPU Adam did not build ({host_adam._reason(e)}); it needs g++ with "
            "OpenMP and ninja; TORCH_EXTENSIONS_DIR moves the build cache"
        ) from e
    return op


def openmp_runtimes() -> list[str]:
    """The OpenMP libraries mapped into this process (torch's; another if a wheel brings one)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({ln.split()[-1] for ln in maps if "libgomp" in ln or "libiomp" in ln})


def set_threads(threads: int) -> None:
    """`threads` for torch and for every OpenMP runtime here: DeepSpeed's parallel loops take the
    runtime's default, from whichever runtime its symbols bind (torch's, when built as here)."""
    torch.set_num_threads(threads)
    for lib in openmp_runtimes():
        ctypes.CDLL(lib).omp_set_num_threads(threads)


def parity(ds: ModuleType) -> float:
    """Max |master difference| after one step of each from the same 1M-element state."""
    n, c = 1 << 20, base.HP.config
    layout, (grad, parts, out) = base.unit(n), base.buffers(n, torch.float32)
    st = parts[0].state
    master, m, v = st.master.clone(), st.m.clone(), st.v.clone()
    adam.update_host(layout, grad, parts, out, base.HP, HostScratch(bf16_moments=False))
    b1, b2 = c.betas
    ds.adam_update(OPT_ID, base.HP.step, base.HP.lr, b1, b2, c.eps, c.weight_decay, True,
                   master, grad.float(), m, v)  # fmt: skip
    return float((master - st.master).abs().max())


def bf16_moments_note(ds: ModuleType) -> str:
    """What DeepSpeed says to FP32 master with BF16 moments (its invokers pair dtypes)."""
    p, g = torch.zeros(64), torch.zeros(64)
    m, v = torch.zeros(64).bfloat16(), torch.zeros(64).bfloat16()
    try:
        ds.adam_update(OPT_ID, 1, 1e-4, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v)
    except RuntimeError as e:
        return f"FP32 master, BF16 moments: {str(e).splitlines()[0]}"
    return "FP32 master, BF16 moments: accepted (unexpected; not timed here)"


def updates(n: int, ds: ModuleType) -> dict[str, base.Update]:
    """Our two paths and DeepSpeed's, on one set of buffers (FP32 moments)."""
    layout, (grad, parts, out) = base.unit(n), base.buffers(n, torch.float32)
    scratch, st, c = HostScratch(bf16_moments=False), parts[0].state, base.HP.config
    grad32 = grad.float()  # (n,) FP32: what DeepSpeed's update takes
    b1, b2 = c.betas

    def ds_update() -> None:
        ds.adam_update(OPT_ID, base.HP.step, base.HP.lr, b1, b2, c.eps, c.weight_decay, True,
                       st.master, grad32, st.m, st.v)  # fmt: skip

    def ds_whole() -> None:
        grad32.copy_(grad)
        ds_update()
        out.copy_(st.master)

    return {
        "kernel": lambda: adam.update_host(layout, grad, parts, out, base.HP, scratch),
        "torch": lambda: adam.update_host_torch(layout, grad, parts, out, base.HP, scratch),
        "ds": ds_update,
        "ds+cvt": ds_whole,
    }


def ds_row(n: int, threads: int, name: str, rate: float, speedup: float) -> None:
    """A `host_adam.row` for DeepSpeed's paths (its `path B/el` column is theirs)."""
    least = base.MIN_BYTES[torch.float32]
    print(
        f"{n:>11,} {'float32':>8} {threads:>3} {name:>6} {rate / 1e6:>8.1f} {least:>8} "
        f"{DS_BYTES[name]:>9} {rate * least / 1e9:>6.2f} {n / rate * 1e3:>8.1f} {speedup:>6.2f}x"
    )


def run(sizes: list[int], ds: ModuleType) -> None:
    all_threads = torch.get_num_threads()
    thread_counts = sorted({1, all_threads})
    print(
        f"{platform.processor() or platform.machine()}, {all_threads} intra-op threads, "
        f"ISA {host_adam.isa()}, torch {torch.__version__}"
    )
    print(f"OpenMP runtimes (threads set in each): {', '.join(openmp_runtimes()) or 'none'}")
    print(f"parity, one step from the same state: max |master(kernel) - master(ds)| = "
          f"{parity(ds):.2e}")  # fmt: skip
    print(f"DeepSpeed, {bf16_moments_note(ds)}")
    for t in thread_counts:
        print(
            f"y += x, {t} thread(s): {base.stream_rate(1 << 28, t) / 1e9:.1f} GB/s (12 B/element)"
        )
    print(f"{'elements':>11} {'moments':>8} {'thr':>3} {'path':>6} {'Melem/s':>8} "
          f"{'min B/el':>8} {'path B/el':>9} {'GB/s':>6} {'ms/unit':>8} {'speedup':>7}")  # fmt: skip
    for n in sizes:
        paths = updates(n, ds)
        for t in thread_counts:
            set_threads(t)
            rates = {name: base.median_rate(f, n, t) for name, f in paths.items()}
            for name, r in rates.items():
                if name in ("kernel", "torch"):
                    base.row(n, torch.float32, t, name, r, r / rates["torch"])
                else:
                    ds_row(n, t, name, r, r / rates["torch"])
            print(f"{'':>11} kernel / ds+cvt {rates['kernel'] / rates['ds+cvt']:.2f}x, "
                  f"kernel / ds {rates['kernel'] / rates['ds']:.2f}x")  # fmt: skip
        del paths
    set_threads(all_threads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sdist", type=Path, help="DeepSpeed's .tar.gz (default: newest in .whl/)")
    p.add_argument("--small-only", action="store_true", help="skip the 3B-layer-sized unit")
    args = p.parse_args()
    t0 = time.perf_counter()
    try:
        sdist = args.sdist or newest_sdist()
        if sdist is None:
            raise Unavailable(f"no .whl/deepspeed-*.tar.gz; fetch it with `{FETCH}`")
        ds = build(unpack(sdist))
    except Unavailable as e:
        print(f"deepspeed_adam: {e}", file=sys.stderr)
        sys.exit(2)
    t1 = time.perf_counter()
    c = base.HP.config
    ds.create_adam(OPT_ID, base.HP.lr, *c.betas, c.eps, c.weight_decay, True, False)  # AdamW, quiet
    assert host_adam.kernel() is not None, "host AdamW kernel did not build (see the log)"
    print(f"{sdist.name}: CPU Adam op ready in {t1 - t0:.1f} s, our kernel in "
          f"{time.perf_counter() - t1:.1f} s (compile on first use, else load)")  # fmt: skip
    run([base.SMALL] if args.small_only else [base.SMALL, base.LAYER_3B], ds)


if __name__ == "__main__":
    main()
