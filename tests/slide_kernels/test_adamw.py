"""The one-pass AdamW kernel against torch's fused AdamW and a float64 loop, CPU interpreter
(FP32 everywhere: the interpreter has no BF16 arithmetic) and GPU (BF16 gradient and weights,
FP32 or BF16 moments)."""

import pytest
import torch
from kernel_checks import assert_close_fp32

from slide_kernels import adamw_step

# the Triton interpreter runs CPU tensors where the suite has no GPU (tests/conftest.py); on a GPU
# machine the kernel runs on CUDA tensors
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HP = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def _state(n: int, seed: int, device: str = DEVICE) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    master, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 3
    m, v = torch.randn(n, generator=gen) * 0.1, torch.rand(n, generator=gen) * 0.01
    return {k: t.to(device) for k, t in {"master": master, "grad": grad, "m": m, "v": v}.items()}


def _torch_fused(s: dict[str, torch.Tensor], step: int, factor: float) -> dict[str, torch.Tensor]:
    """torch's fused AdamW on copies, the gradient multiplied by `factor` first."""
    master, m, v = s["master"].clone(), s["m"].clone(), s["v"].clone()
    torch._fused_adamw_([master], [s["grad"].float() * factor], [m], [v], [],
                        [torch.tensor(float(step), device=master.device)], lr=HP["lr"],
                        beta1=HP["betas"][0], beta2=HP["betas"][1], weight_decay=HP["weight_decay"],
                        eps=HP["eps"], amsgrad=False, maximize=False)  # fmt: skip
    return {"master": master, "m": m, "v": v}


def _float64(s: dict[str, torch.Tensor], step: int, factor: float) -> dict[str, torch.Tensor]:
    """AdamW written out in float64: the gold."""
    p, m, v = (s[k].double() for k in ("master", "m", "v"))
    g = s["grad"].double() * factor
    b1, b2 = HP["betas"]
    p = p * (1 - HP["lr"] * HP["weight_decay"])
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = v.sqrt() / (1 - b2**step) ** 0.5 + HP["eps"]
    return {"master": p - HP["lr"] / (1 - b1**step) * m / denom, "m": m, "v": v}


def _kernel(s, step, *, coef=None, grad_scale=1.0, moments=None, weights_dtype=None):
    master = s["master"].clone()
    m, v = (s[k].to(moments or torch.float32, copy=True) for k in ("m", "v"))
    weights = torch.empty_like(master, dtype=weights_dtype or master.dtype)
    adamw_step(master, s["grad"], m, v, weights, step=step, coef=coef, grad_scale=grad_scale, **HP)
    return {"master": master, "m": m, "v": v, "weights": weights}


@pytest.mark.parametrize("n", [1, 2047, 2048, 5000])
@pytest.mark.parametrize("step", [1, 7])
def test_adamw_step_matches_torch_fused_and_float64(n, step):
    s = _state(n, seed=n + step)
    got = _kernel(s, step)
    assert torch.equal(got["weights"], got["master"])  # FP32 weights: the master itself
    for gold in (_float64(s, step, 1.0), _torch_fused(s, step, 1.0)):
        for k in ("master", "m", "v"):
            assert_close_fp32(got[k], gold[k].to(got[k].dtype), "adamw")


def test_clipping_coefficient_and_scale_multiply_the_gradient():
    """A device coefficient (per-unit clipping) and a host scale (global clipping) both scale
    the gradient before the moments see it."""
    s = _state(3000, seed=3)
    coef = torch.tensor(0.25, device=DEVICE)
    got = _kernel(s, 2, coef=coef, grad_scale=0.5)
    gold = _float64(s, 2, 0.125)
    for k in ("master", "m", "v"):
        assert_close_fp32(got[k], gold[k].float(), "adamw")
    unscaled = _kernel(s, 2)
    assert not torch.allclose(unscaled["m"], got["m"])


def test_bad_operands_are_named():
    s = _state(10, seed=1)
    with pytest.raises(ValueError, match="m must be contiguous with 10 elements"):
        adamw_step(s["master"], s["grad"], s["m"][:5], s["v"], s["master"].clone(), step=1, **HP)
    with pytest.raises(ValueError, match="step >= 1"):
        adamw_step(s["master"], s["grad"], s["m"], s["v"], s["master"].clone(), step=0, **HP)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("moments", [torch.float32, torch.bfloat16])
def test_adamw_step_on_cuda_with_bf16_gradient_and_weights(moments):
    s = _state(1 << 20, seed=9)
    s["grad"] = s["grad"].bfloat16()
    got = _kernel(s, 3, moments=moments, weights_dtype=torch.bfloat16)
    gold = _torch_fused(dict(s, m=s["m"].to(moments).float(), v=s["v"].to(moments).float()), 3, 1.0)
    assert torch.equal(got["weights"], got["master"].bfloat16())
    if moments == torch.float32:
        for k in ("master", "m", "v"):
            assert_close_fp32(got[k], gold[k], "adamw")
    else:  # the moments rounded to BF16 once: within a BF16 ulp of torch's rounded result
        for k in ("m", "v"):
            want = gold[k].bfloat16().float()
            atol = 1e-5 * want.abs().max().item()
            assert torch.allclose(got[k].float(), want, rtol=2**-7, atol=atol), k
