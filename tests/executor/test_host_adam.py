"""The single-pass host AdamW (executor/host_adam.py, csrc/host_adam.cpp) against
`torch.optim.AdamW`, against the chunked torch path it replaces, and inside the executor.

The oracle holds FP32 parameters and moments; for BF16 moments its moments are rounded to BF16
after every step, which is what keeping them in BF16 means, so both sides round the same values.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math

import pytest
import torch
from runs import STEPS, max_rel_error, reference, run_executor

from executor import adam, host_adam
from executor.adam import AdamWConfig, HostScratch, Part, StepHp
from executor.buffers import OptState
from executor.layout import Entry, UnitLayout

# (rtol, atol) per compared tensor, with the reason.
TOL = {
    # torch.optim.AdamW (single-tensor) orders the same float ops differently (addcdiv, lerp
    # without fma, v's mul + addcmul): an ulp or two, which Adam's division can enlarge a little.
    "fp32": (2e-6, 1e-7),
    # BF16 moments: a last-bit difference in FP32 can round to the neighbouring BF16 value
    # (2^-8 relative), and that moment feeds the next steps' updates (lr 1e-3 scale).
    "bf16-moments": (2**-7, 1e-6),
}
SIZES = [1, 7, 15, 16, 17, 33, 1000, 65_537, 100_003]  # vector width 16 (AVX-512) or 8 (AVX2)
LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert host_adam.kernel() is not None, "the host AdamW kernel must build on this machine"


def _oracle_run(
    p0: torch.Tensor,
    grads: list[torch.Tensor],
    wd: float,
    clip: float | None,
    bf16_moments: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=wd, foreach=False)
    for g in grads:
        p.grad = g.to(torch.float32, copy=True)  # clip_grad_norm_ scales it in place
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([p], clip)
        opt.step()
        if bf16_moments:
            for k in ("exp_avg", "exp_avg_sq"):
                opt.state[p][k].copy_(opt.state[p][k].bfloat16())
    st = opt.state[p]
    return p.detach(), st["exp_avg"], st["exp_avg_sq"]


def _kernel_run(
    p0: torch.Tensor,
    grads: list[torch.Tensor],
    wd: float,
    clip: float | None,
    moments: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    master = p0.clone()
    m, v = torch.zeros_like(p0, dtype=moments), torch.zeros_like(p0, dtype=moments)
    out = torch.empty_like(p0, dtype=grads[0].dtype)
    for step, g in enumerate(grads, 1):
        coef = adam.clip_coef(g, clip)
        host_adam.adamw_(
            g, master, m, v, out, step=step, lr=LR, betas=BETAS, eps=EPS, weight_decay=wd,
            grad_scale=1.0 if coef is None else float(coef),
        )  # fmt: skip
    return master, m, v, out


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("moments", [torch.float32, torch.bfloat16], ids=["m32", "m16"])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16], ids=["g32", "g16"])
@pytest.mark.parametrize("wd", [0.0, 0.1], ids=["nowd", "wd"])
@pytest.mark.parametrize("clip", [None, 0.05], ids=["noclip", "clip"])
def test_kernel_matches_torch_adamw(
    n: int, moments: torch.dtype, grad_dtype: torch.dtype, wd: float, clip: float | None
) -> None:
    gen = torch.Generator().manual_seed(n)
    p0 = torch.randn(n, generator=gen)
    grads = [torch.randn(n, generator=gen).to(grad_dtype) for _ in range(4)]
    bf16 = moments == torch.bfloat16
    want_p, want_m, want_v = _oracle_run(p0, grads, wd, clip, bf16)
    master, m, v, out = _kernel_run(p0, grads, wd, clip, moments)
    rtol, atol = TOL["bf16-moments" if bf16 else "fp32"]
    torch.testing.assert_close(master, want_p, rtol=rtol, atol=atol)
    torch.testing.assert_close(m.float(), want_m, rtol=rtol, atol=atol)
    torch.testing.assert_close(v.float(), want_v, rtol=rtol, atol=atol * atol)
    assert torch.equal(out, master.to(grad_dtype)), "out is the master cast (round to nearest)"


def test_bf16_out_rounds_to_nearest_even_and_keeps_nan() -> None:
    n = 64
    master = torch.randn(n)
    master[3] = float("nan")
    m, v, g = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    out = torch.empty(n, dtype=torch.bfloat16)
    host_adam.adamw_(g, master, m, v, out, step=1, lr=0.0, betas=BETAS, eps=EPS, weight_decay=0)
    torch.testing.assert_close(out, master.bfloat16(), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("moments", [torch.float32, torch.bfloat16], ids=["m32", "m16"])
def test_no_copy_updates_the_state_as_with_one(moments: torch.dtype) -> None:
    """A unit whose uploads cast from the master passes no `out`: master and moments come out
    bitwise as when the copy is written, and the copy is what a later cast of the master gives."""
    n = 100_003
    gen = torch.Generator().manual_seed(2)
    p0, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen).bfloat16()
    runs = []
    for out in (torch.empty(n, dtype=torch.bfloat16), None):
        master = p0.clone()
        m, v = torch.zeros(n, dtype=moments), torch.zeros(n, dtype=moments)
        for step in (1, 2):
            host_adam.adamw_(g, master, m, v, out, step=step, lr=LR, betas=BETAS, eps=EPS,
                             weight_decay=0.1)  # fmt: skip
        runs.append((master, m, v, out))
    (master, m, v, out), (master2, m2, v2, _) = runs
    assert torch.equal(master, master2) and torch.equal(m, m2) and torch.equal(v, v2)
    assert out is not None and torch.equal(out, master2.bfloat16())


def test_threads_split_the_range_without_changing_results() -> None:
    n = 200_003  # several 32 Ki-element blocks per thread, an odd tail
    gen = torch.Generator().manual_seed(1)
    p0, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen).bfloat16()
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            master, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
            out = torch.empty(n, dtype=torch.bfloat16)
            host_adam.adamw_(
                g, master, m, v, out, step=1, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.1
            )
            results.append((master, m, v, out))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))


def _unit(n_decay: int, n_rest: int) -> UnitLayout:
    segs = (
        Entry(name="w", offset=0, shape=(n_decay,)),
        Entry(name="b", offset=n_decay, shape=(n_rest,)),
    )
    return UnitLayout(unit=1, segments=segs, hf=segs, decay_numel=n_decay)


def _state(n: int, moments: torch.dtype, gen: torch.Generator) -> OptState:
    return OptState(
        master=torch.randn(n, generator=gen),
        m=(torch.randn(n, generator=gen) * 1e-2).to(moments),
        v=(torch.randn(n, generator=gen) ** 2 * 1e-4).to(moments),
    )


@pytest.mark.parametrize("moments", [torch.float32, torch.bfloat16], ids=["m32", "m16"])
@pytest.mark.parametrize("clip", [None, 0.05], ids=["noclip", "clip"])
def test_update_host_equals_torch_path(moments: torch.dtype, clip: float | None) -> None:
    """Decay groups x two state stripes x torch's 1 Mi chunks: the kernel path and the chunked
    torch path agree except in the last bit of v where torch runs its scalar tail."""
    layout = _unit(adam.CHUNK + 4_099, 2_053)  # a decay range over one chunk, odd sizes
    n, cut = layout.numel, 777_777  # two stripes, the cut inside the decay range
    gen = torch.Generator().manual_seed(0)
    stripes = [(0, cut), (cut, n)]
    states = [_state(hi - lo, moments, gen) for lo, hi in stripes]
    twins = [OptState(master=s.master.clone(), m=s.m.clone(), v=s.v.clone()) for s in states]
    grad = torch.randn(n, generator=gen).bfloat16()
    cfg = AdamWConfig(lr=LR, weight_decay=0.1)
    outs = [torch.empty(n, dtype=torch.bfloat16) for _ in range(2)]
    scratch = HostScratch(bf16_moments=moments == torch.bfloat16)
    for step in (1, 2, 3):
        hp = StepHp(step=step, lr=cfg.lr, config=cfg, clip_norm=clip)
        parts = [Part(lo=lo, hi=hi, state=s) for (lo, hi), s in zip(stripes, states, strict=True)]
        twin_parts = [
            Part(lo=lo, hi=hi, state=s) for (lo, hi), s in zip(stripes, twins, strict=True)
        ]
        adam.update_host(layout, grad, parts, outs[0], hp, scratch)
        adam.update_host_torch(layout, grad, twin_parts, outs[1], hp, scratch)
    for ours, theirs in zip(states, twins, strict=True):
        assert torch.equal(ours.master, theirs.master)
        assert torch.equal(ours.m, theirs.m)
        # v: one ulp (2^-22 relative anywhere in a binade; 2^-7 for BF16) at torch's tails
        torch.testing.assert_close(
            ours.v, theirs.v, rtol=2**-22 if moments == torch.float32 else 2**-7, atol=0
        )
    assert torch.equal(outs[0], outs[1])


def test_executor_runs_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU-mode run goes through the kernel and still equals the plain PyTorch loop."""
    calls = []
    real = host_adam.adamw_

    def counting(*args: object, **kwargs: object) -> None:
        calls.append(1)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(host_adam, "adamw_", counting)
    clip = 0.05
    ref_losses, ref_state = reference(False, 1, clip)
    result = run_executor(False, clip="per-unit", clip_norm=clip)
    assert calls, "the cpu lane did not call the host kernel"
    for ours, want in zip(result.losses, ref_losses, strict=True):
        assert abs(ours - want) <= 1e-5 * abs(want)
    err, name = max_rel_error(result.final_state, ref_state)
    assert err <= 1e-5, f"{name}: relative error {err:.2e}"
    assert result.steps_done == STEPS


def test_executor_bf16_moments_kernel_equals_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """BF16 moments and weight decay have no plain-loop reference: the kernel's run equals the
    torch path's run to within the last-bit differences of v."""
    kwargs = {"train_kwargs": {"optim": AdamWConfig(lr=1e-3, weight_decay=0.1)}}
    ours = run_executor(True, moments_dtype="bf16", **kwargs)
    monkeypatch.setattr(host_adam, "kernel", lambda: None)
    theirs = run_executor(True, moments_dtype="bf16", **kwargs)
    for a, b in zip(ours.losses, theirs.losses, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)
    err, name = max_rel_error(ours.final_state, theirs.final_state)
    assert err <= 1e-5, f"{name}: relative error {err:.2e}"


def test_failed_build_falls_back_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(target: str) -> None:
        raise RuntimeError(f"Building {target}\nc++: error: command not found")

    monkeypatch.setattr(host_adam, "_build", no_compiler)
    monkeypatch.setattr(host_adam, "_kernel", functools.cache(host_adam._kernel.__wrapped__))
    with caplog.at_level(logging.WARNING, logger="executor.host_adam"):
        assert host_adam.kernel() is None
        assert host_adam.kernel() is None
    (record,) = caplog.records
    assert "c++: error: command not found" in record.getMessage()


def test_a_build_says_so_and_where_it_is_cached(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path
) -> None:
    """A first run's ~17 s compile is one line at the default log level, naming the cache."""
    from torch.utils import cpp_extension

    assert host_adam.kernel() is not None  # the op is registered: the stubbed build returns it
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(host_adam, "_load_built", lambda name: False)
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: None)
    with caplog.at_level("WARNING", logger="executor.host_adam"):
        host_adam._build("portable")
    (line,) = [r.getMessage() for r in caplog.records if "building" in r.getMessage()]
    assert "once per host" in line and str(tmp_path / "slide_host_adam_portable") in line


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_a_bf16_host_norm_is_summed_in_double_by_the_kernel() -> None:
    """The kernel's sum of squares is the exact one to double rounding, on any thread count,
    the same bits on the same count; FP32 tensors keep torch's own norm."""
    g = torch.randn(3 * 4096 * 16 + 17, generator=torch.Generator().manual_seed(0)).bfloat16()
    exact = float((g.double() ** 2).sum())
    runs = []
    for threads in (1, 2):
        with _threads(threads):
            runs.append(host_adam.sumsq(g))
            runs.append(host_adam.sumsq(g))
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert all(abs(r - exact) <= 1e-12 * exact for r in runs)
    norm = adam.fp32_norm(g)
    assert norm.dtype == torch.float32 and norm.item() == pytest.approx(math.sqrt(exact), rel=1e-7)
    assert torch.equal(adam.fp32_norm(g.float()), torch.linalg.vector_norm(g.float()))


@pytest.mark.parametrize("moments", [torch.float32, torch.bfloat16], ids=["m32", "m16"])
@pytest.mark.parametrize("offset", [0, 1, 3, 16])
def test_a_saving_update_keeps_the_old_state_and_updates_bitwise_as_one_without(
    moments: torch.dtype, offset: int
) -> None:
    """A speculative update copies the state as it was into the rollback buffers (streaming
    stores, from any alignment: the buffers here start `offset` elements into their storage)
    and leaves master, moments and copy bitwise as an update that saves nothing."""
    n = 100_003  # several save tiles and thread blocks, an odd tail
    gen = torch.Generator().manual_seed(offset)
    p0, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen).bfloat16()
    m0 = (torch.randn(n, generator=gen) * 1e-3).to(moments)
    v0 = (torch.rand(n, generator=gen) * 1e-6).to(moments)

    def at_offset(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(n + offset, dtype=t.dtype)[offset:].copy_(t)

    runs = []
    for save in (False, True):
        master, m, v = at_offset(p0), at_offset(m0), at_offset(v0)
        out = torch.empty(n, dtype=torch.bfloat16)
        saved = OptState(master=at_offset(torch.full_like(p0, 7)),
                         m=at_offset(torch.full_like(m0, 7)), v=at_offset(torch.full_like(v0, 7)))  # fmt: skip
        host_adam.adamw_(g, master, m, v, out, step=3, lr=LR, betas=BETAS, eps=EPS,
                         weight_decay=0.1, saved=saved if save else None)  # fmt: skip
        runs.append(((master, m, v, out), saved))
    (plain, _), (saving, saved) = runs
    for a, b in zip(plain, saving, strict=True):
        assert torch.equal(a, b)
    for got, want in zip((saved.master, saved.m, saved.v), (p0, m0, v0), strict=True):
        assert torch.equal(got, want)
