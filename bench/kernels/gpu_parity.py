"""BF16 training on CUDA against plain PyTorch, within BF16 noise (the GPU's correctness).

A random-init model is trained for N steps three ways on the same batches: an FP32 gold run
(transformers + torch AdamW, all FP32 on the GPU), the usual BF16 mixed-precision loop (BF16
model, FP32 master weights + torch AdamW on the GPU), and the executor in BF16 from a plan (one
run per variant). BF16 noise is the reference loop's distance from gold. The executor passes when
its own distance is at most twice that (+1e-3), both for the per-step loss and for the weights,
measured as ||w - w_gold|| / ||w_gold - w_init||: how far off, relative to how far training
moved them. The batches repeat a random motif along each sequence, drawn from a small part of the
vocabulary, so the loss falls (first the unigram, then copying) and the comparison covers real
learning, not noise around a flat loss.

    python -m bench.kernels.gpu_parity --model llama-3.2-1b --steps 50 --out parity.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from bench.speed.train_throughput import variant_fields
from executor.adam import AdamWConfig
from executor.reference_loop import reference_train
from slide.session import train
from slide_ir import TrainConfig, load_machine, load_model

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def random_model(config: dict, seed: int = 0, device: str = "cpu") -> transformers.PreTrainedModel:
    """A float32 transformers model with SDPA attention, random init under `seed` on `device`
    (a 1B model initialises in seconds on a GPU, in minutes on a few host cores)."""
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.float()


def plain_loop(
    make_model: Callable[[], torch.nn.Module],
    batches: Batches,
    dtype: torch.dtype,
    lr: float,
    device: str = "cuda",
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`executor.reference_loop` on `device` in `dtype` (FP32 master weights beside a BF16
    model). Returns the per-step losses and the final FP32 weights (on the CPU)."""
    return reference_train(make_model(), batches, lr=lr, dtype=dtype, device=device)


def weight_error(ours: dict, gold: dict, init: dict) -> float:
    num = sum(float((ours[k] - gold[k]).norm() ** 2) for k in gold)
    den = sum(float((gold[k] - init[k]).norm() ** 2) for k in gold)
    return (num / den) ** 0.5


def copy_task(active: int, batch: int, seq: int, steps: int, motif: int = 64) -> Batches:
    """Token ids < `active`, a random motif of `motif` tokens repeated along each sequence."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        base = torch.randint(0, active, (batch, motif), generator=g)
        ids = base.repeat(1, (seq + 1) // motif + 1)[:, : seq + 1]
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def within_bf16_noise(ours: tuple[float, float], reference: tuple[float, float]) -> bool:
    """(loss error, weight error) of ours against those of the plain BF16 loop."""
    return all(o <= 2 * r + 1e-3 for o, r in zip(ours, reference, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--variants", default="pure,streamed=auto+activations=gpu")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    spec = load_model(args.model)
    config = {**spec.to_hf_config(), "attention_dropout": 0.0}
    batches = copy_task(min(spec.vocab_size, 4096), args.batch, args.seq, args.steps)
    init = {
        k: v.detach().cpu() for k, v in random_model(config, device="cuda").state_dict().items()
    }
    if spec.tied_embeddings:
        init.pop("lm_head.weight", None)
    t0 = time.perf_counter()
    gold_losses, gold = plain_loop(lambda: random_model(config, device="cuda"), batches,
                                   torch.float32, args.lr)  # fmt: skip
    ref_losses, ref = plain_loop(lambda: random_model(config, device="cuda"), batches,
                                 torch.bfloat16, args.lr)  # fmt: skip
    print(f"plain loops: {time.perf_counter() - t0:.0f} s", flush=True)
    ref_err = (
        max(abs(a - b) for a, b in zip(ref_losses, gold_losses, strict=True)),
        weight_error(ref, gold, init),
    )
    report = {"model": spec.name, "steps": args.steps, "batch": args.batch, "seq": args.seq,
              "lr": args.lr, "gold_losses": gold_losses, "bf16_loop_losses": ref_losses,
              "bf16_loop_errors": ref_err, "variants": {}}  # fmt: skip
    for variant in args.variants.split(","):
        t0 = time.perf_counter()
        result = train(
            spec,
            load_machine("h200-16c-128g"),
            TrainConfig(
                batch=args.batch, seq=args.seq, steps=args.steps, **variant_fields(variant)
            ),
            initial_state=init,
            batches=batches,
            optim=AdamWConfig(lr=args.lr),
            device="cuda",
            dtype=torch.bfloat16,
        )
        ours = (
            max(abs(a - b) for a, b in zip(result.losses, gold_losses, strict=True)),
            weight_error(result.final_state, gold, init),
        )
        report["variants"][variant] = {
            "losses": result.losses,
            "errors": ours,
            "within_bf16_noise": within_bf16_noise(ours, ref_err),
            "seconds": time.perf_counter() - t0,
        }
        print(f"{variant}: loss err {ours[0]:.2e} (bf16 loop {ref_err[0]:.2e}), weight err "
              f"{ours[1]:.4f} (bf16 loop {ref_err[1]:.4f}), loss {result.losses[0]:.3f} -> "
              f"{result.losses[-1]:.3f}, pass {report['variants'][variant]['within_bf16_noise']}",
              flush=True)  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
