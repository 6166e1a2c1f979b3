"""Which sliding units get a streamed update: AdamW on the GPU, FP32 state over the link.

On a fast GPU the host optimizer is the bottleneck of the sliding schedule (the update of every
parameter must fit in the backward), while the link is idle for much of the step. A streamed
unit's FP32 master and moments (12 B/param with FP32 moments) go up before its backward, a fused
GPU AdamW updates it, and state plus new BF16 weights (14 B/param) come back: work moves from the
CPU to the copy engines. Units stream in `resident_preference` order (the embedding, then
decoder layers 1, 2, ...): their updates come last in the backward, where nothing hides a CPU
update, and they are the first the next step's forward needs.

`auto` picks the smallest count whose estimated step (`estimate_step_s`) is within NEAR_BEST of
the shortest, among those whose ledger fits, and streams nothing unless that beats no streaming by
MIN_GAIN: the estimate is rough, and streaming costs GPU memory and pinned RAM.
"""

from __future__ import annotations

from slide_ir.planning.compute_terms import lce_chunk_tokens
from slide_ir.planning.cost import CostModel
from slide_ir.planning.emit_context import StatePace
from slide_ir.planning.ledger import build_ledger, gpu_budget
from slide_ir.planning.shapes import layer_work, loss_work, recompute_work
from slide_ir.planning.units import (
    BF16,
    FP32,
    adam_bytes_per_param,
    resident_preference,
    unit_params,
)
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine
from slide_ir.specs.model import ModelSpec

MIN_GAIN = 0.03
NEAR_BEST = 0.02  # the smallest count this close to the best estimate: it flattens out


def choose_streamed(
    model: ModelSpec, machine: Machine, config: TrainConfig, resident: tuple[int, ...]
) -> tuple[int, ...]:
    """The first `streamed` sliding units of `resident_preference`, or with "auto" the count
    that minimises `estimate_step_s` among those whose ledger fits, with the GPU's under
    `ledger.gpu_budget` (the closed-form rule `slide_ir.planning.placement` seeds its search with)."""
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
    if config.optimizer != "cpu" or config.grad_accum != 1 or config.deferred_updates:
        return ()
    cost = CostModel(machine, cpu_threads=config.cpu_threads)
    budget = gpu_budget(machine, config)
    estimates = {0: estimate_step_s(model, config, cost, candidates, ())}
    for count in range(1, len(candidates) + 1):
        chosen = tuple(candidates[:count])
        ledger = build_ledger(model, machine, config, resident, chosen)
        if ledger.peak_bytes("gpu") > budget:
            break
        if ledger.feasible:  # host RAM: more streaming needs fewer landing buffers
            estimates[count] = estimate_step_s(model, config, cost, candidates, chosen)
    best_s = min(estimates.values())
    if best_s > estimates[0] * (1 - MIN_GAIN):
        return ()
    best = min(c for c, s in estimates.items() if s <= best_s * (1 + NEAR_BEST))
    return tuple(candidates[:best])


def state_pace(model: ModelSpec, machine: Machine, config: TrainConfig) -> StatePace:
    """With the layer inputs on the GPU the next forward and loss leave `d2h` idle: state
    downloads can spill into them. Saved to the host, the inputs need the lane."""
    cost = CostModel(machine, cpu_threads=config.cpu_threads)
    return StatePace(spill_s=_spill_s(model, config, cost), link_bytes_per_s=cost.rates.link)


def _spill_s(model: ModelSpec, config: TrainConfig, cost: CostModel) -> float:
    """How long the next forward and loss leave `d2h` free for state downloads."""
    if config.activations != "gpu":
        return 0.0
    return model.num_layers * _layer_s(model, config, cost) + _loss_s(model, config, cost)


def _layer_s(model: ModelSpec, config: TrainConfig, cost: CostModel) -> float:
    """One decoder layer's forward."""
    return cost.compute_seconds(layer_work(model, config, backward=False))


def _loss_s(model: ModelSpec, config: TrainConfig, cost: CostModel) -> float:
    return cost.loss_seconds(loss_work(model, config, lce_chunk_tokens(model, config)))


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
    (the embedding first, then layers 1..k): the loss and backward last as long as their
    compute or the uploads they carry (the backward's weights and every state), whichever is
    longer; the streamed layers' backward as long as their compute or the downloads that do
    not spill into the next forward (`state_pace`); the CPU must finish the host-updated layers
    before the next forward reaches layer k+1."""
    b, s, n = config.batch, config.seq, model.num_layers
    fwd = _layer_s(model, config, cost)
    bwd = cost.compute_seconds(recompute_work(model, config))
    bwd += cost.compute_seconds(layer_work(model, config, backward=True))
    loss = _loss_s(model, config, cost)
    link, t_fwd = cost.rates.link, n * fwd
    params = {u: unit_params(model, u) for u in sliding}
    host = [u for u in sliding if u not in streamed]
    t_cpu = sum(params[u] for u in host) / cost.rates.adam(adam_bytes_per_param(config), 1.0)
    act = 0 if config.activations == "gpu" else b * s * model.hidden_size * BF16
    state = FP32 + config.moment_bytes
    up = {u: (2 * BF16 + (state if u in streamed else 0)) * params[u] + act for u in sliding}
    down = {u: (BF16 + (state if u in streamed else 0)) * params[u] + act for u in sliding}
    t_link = max(sum(up.values()), sum(down.values())) / link
    if not streamed:
        return max(t_fwd + n * bwd + loss, t_cpu + t_fwd, t_link)
    layers = sum(1 for u in sliding if 1 <= u <= n)
    streamed_layers = sum(1 for u in streamed if 1 <= u <= n)
    downloads = sum(down[u] - act for u in streamed) / link
    tail_layers = max(streamed_layers * bwd, downloads - _spill_s(model, config, cost))
    t_up = sum(up[u] - BF16 * params[u] for u in sliding) / link  # all but the forward's weights
    t_bwd = max(loss + (layers - streamed_layers) * bwd + tail_layers, t_up)
    # a streamed embedding's new weights: down, then up again, before the next forward
    tail = 2 * BF16 * params[0] / link if 0 in streamed else 0.0
    gpu_chain = t_fwd + t_bwd + tail
    cpu_chain = t_fwd * (1 - streamed_layers / n) + loss + t_cpu
    return max(gpu_chain, cpu_chain, t_link)
