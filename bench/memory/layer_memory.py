"""One decoder layer's recompute + backward on the GPU, as the executor runs it: the bytes autograd
holds after the recomputed forward and the peak during the backward, against the ledger's model
(`ModelSpec.layer_saved_terms`, `layer_transient_bytes`). The incoming gradient, the input's
gradient and the weight gradients live in buffers allocated before the count starts, as in the
executor (hidden-gradient slots and the cache unit).

    python -m bench.memory.layer_memory
"""

from __future__ import annotations

import torch

from executor import layers
from executor.layout import layer_layout
from slide_ir.specs.model_catalog import load_model

CASES = (("llama-3.2-3b", 16), ("llama-3.2-3b", 48), ("llama-3.1-8b", 16), ("qwen3-8b", 16))
SEQ = 1024
GIB = 1 << 30


def measure(name: str, batch: int) -> tuple[int, int]:
    """(bytes held after the recompute, peak bytes during recompute + backward)."""
    spec, dev = load_model(name), torch.device("cuda")
    layout = layer_layout(spec, 1)
    weights = (torch.randn(layout.numel, device=dev) * 0.02).bfloat16()
    grads = torch.zeros(layout.numel, device=dev, dtype=torch.bfloat16)
    rope = layers.make_rope(spec, SEQ, dev, torch.bfloat16)
    x_in = torch.randn(batch, SEQ, spec.hidden_size, device=dev, dtype=torch.bfloat16)
    grad_out, grad_in = torch.randn_like(x_in), torch.zeros_like(x_in)
    for _ in range(2):  # the second pass is measured: cuBLAS and Triton set up in the first
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        x = x_in.detach().requires_grad_()
        leaves = {k: v.detach().requires_grad_() for k, v in layout.views(weights).items()}
        with torch.enable_grad():
            out = layers.decoder_layer_taped(x, leaves, spec, rope)
        held = torch.cuda.memory_allocated() - base
        x.grad = grad_in
        for key, leaf in leaves.items():
            leaf.grad = layout.views(grads)[key]
        torch.autograd.backward(out, grad_out, inputs=[x, *leaves.values()])
        del out, x, leaves
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    return held, peak


def main() -> None:
    print("| model | batch | held after recompute GiB (model) | peak GiB (model) | error |")
    print("|---|---:|---|---|---:|")
    for name, batch in CASES:
        held, peak = measure(name, batch)
        spec = load_model(name)
        saved = sum(spec.layer_saved_terms(batch, SEQ).values())
        model = spec.layer_transient_bytes(batch, SEQ)
        print(f"| {name} | {batch} | {held / GIB:.3f} ({saved / GIB:.3f}) | {peak / GIB:.3f} "
              f"({model / GIB:.3f}) | {(model - peak) / peak:+.1%} |", flush=True)  # fmt: skip
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
