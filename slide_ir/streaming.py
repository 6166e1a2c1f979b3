"""Which sliding units get a streamed update: AdamW on the GPU, FP32 state over the link.

On a fast GPU the host optimizer is the bottleneck of the sliding schedule (the update of every
parameter must fit in the backward), while the link is idle for much of the step. A streamed
unit's FP32 master and moments (12 B/param with FP32 moments) go up before its backward, a fused
GPU AdamW updates it, and state plus new BF16 weights (14 B/param) come back: work moves from the
CPU to the copy engines. Units stream in `resident_preference` order (the embedding, then
decoder layers 1, 2, ...): their updates come last in the backward, where nothing hides a CPU
update, and they are the first the next step's forward needs.

`auto` picks the count with the shortest estimated step (`estimate_step_s`; the smallest count
on ties) among those whose ledger fits, and streams nothing unless that beats no streaming by
MIN_GAIN: the estimate is rough, and streaming costs GPU memory and pinned RAM.
"""

from __future__ import annotations

from slide_ir.config import TrainConfig
from slide_ir.cost import CostModel
from slide_ir.graph import Work
from slide_ir.hardware import Machine
from slide_ir.ledger import (
    BF16,
    FP32,
    adam_bytes_per_param,
    build_ledger,
    resident_preference,
    unit_params,
)
from slide_ir.model import ModelSpec
from slide_ir.schedules import layer_work

MIN_GAIN = 0.03


def choose_streamed(
    model: ModelSpec, machine: Machine, config: TrainConfig, resident: tuple[int, ...]
) -> tuple[int, ...]:
    """The first `streamed` sliding units of `resident_preference`, or with "auto" the count
    that minimises `estimate_step_s` among those whose ledger fits, with the GPU's under
    (1 - gpu_margin)."""
    if config.schedule != "sliding":
        return ()
    candidates = [u for u in resident_preference(model) if u not in resident]
    if config.streamed != "auto":
        count = int(config.streamed)
        if count > len(candidates):
            raise ValueError(
                f"streamed must be at most {len(candidates)} (the sliding units of "
                f"{model.name}), got {count}"
            )
        return tuple(candidates[:count])
    if config.optimizer != "cpu" or config.grad_accum != 1:
        return ()
    cost = CostModel(machine, cpu_threads=config.cpu_threads)
    budget = (1.0 - config.gpu_margin) * machine.gpu.memory_bytes
    none_s = estimate_step_s(model, config, cost, candidates, ())
    best, best_s = 0, none_s
    for count in range(1, len(candidates) + 1):
        chosen = tuple(candidates[:count])
        ledger = build_ledger(model, machine, config, resident, chosen)
        if ledger.peak_bytes("gpu") > budget:
            break
        if not ledger.feasible:  # host RAM: more streaming needs fewer landing buffers
            continue
        seconds = estimate_step_s(model, config, cost, candidates, chosen)
        if seconds < best_s * (1 - 1e-3):
            best, best_s = count, seconds
    if best_s > none_s * (1 - MIN_GAIN):
        return ()
    return tuple(candidates[:best])


def estimate_step_s(
    model: ModelSpec,
    config: TrainConfig,
    cost: CostModel,
    sliding: list[int],
    streamed: tuple[int, ...],
) -> float:
    """A closed-form step time of the sliding schedule with these units streamed (the simulator
    refines it). Without streaming: the slowest of GPU compute, CPU updates + the forward (the
    forward's first layers wait for the backward's last updates), and the link. With streaming
    (the embedding first, then layers 1..k): the backward runs at the GPU's pace through the
    host-updated layers (the landing ring lets it run ahead of the CPU) and at the slower of
    GPU and link through the streamed ones; the CPU must finish the host-updated layers before
    the next forward reaches layer k+1."""
    b, s, n = config.batch, config.seq, model.num_layers
    fwd = cost.compute_seconds(layer_work(model, config, backward=False))
    bwd = fwd + cost.compute_seconds(layer_work(model, config, backward=True))
    loss = cost.compute_seconds(Work(flops=model.head_fwd_flops(b, s) + model.head_bwd_flops(b, s)))
    link, t_fwd = cost.rates.link, n * fwd
    params = {u: unit_params(model, u) for u in sliding}
    host = [u for u in sliding if u not in streamed]
    t_cpu = sum(params[u] for u in host) / cost.rates.adam(adam_bytes_per_param(config))
    act = 0 if config.activations == "gpu" else b * s * model.hidden_size * BF16
    state = FP32 + config.moment_bytes
    up = {u: (2 * BF16 + (state if u in streamed else 0)) * params[u] + act for u in sliding}
    down = {u: (BF16 + (state if u in streamed else 0)) * params[u] + act for u in sliding}
    t_link = max(sum(up.values()), sum(down.values())) / link
    if not streamed:
        return max(t_fwd + n * bwd + loss, t_cpu + t_fwd, t_link)
    layers = [u for u in sliding if 1 <= u <= n]
    t_bwd = sum(max(bwd, up[u] / link, down[u] / link) if u in streamed else bwd for u in layers)
    # a streamed embedding's new weights: down, then up again, before the next forward
    tail = 2 * BF16 * params[0] / link if 0 in streamed else 0.0
    streamed_layers = sum(1 for u in streamed if 1 <= u <= n)
    gpu_chain = t_fwd + loss + t_bwd + tail
    cpu_chain = t_fwd * (1 - streamed_layers / n) + loss + t_cpu
    return max(gpu_chain, cpu_chain, t_link)
