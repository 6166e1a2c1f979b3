"""Predicted time of one rollout round on a pool of engines: prefill at the compute rate,
decode at the memory-bandwidth rate, with the batch the KV budget allows.

Each of E engines serves n = ceil(P x S / E) sequences in waves of b (the ledger's batch:
the concurrency asked for, else as many as the KV holds), w = ceil(n / b) waves. Per engine:

    prefill  = ceil(n / S) prompts x FLOPs(prompt) / G, at the GPU's matmul and attention rates
               (`CostModel.compute_seconds`): the samples of a prompt share its prefix (the radix
               cache, with cache-aware routing), so a prompt is prefilled once;
               FLOPs(prompt) = sum over layers of 2 x active matmul params x prompt + causal
               attention, plus the LM head on the last token
    decode   = sum over waves of response x t_step(wave's batch, c_mean),
               c_mean = prompt + (response + 1) / 2, the mean context while decoding, exact for
               the KV term, which is linear in it
    t_step(b, c) = max(bytes / HBM, FLOPs / matmul rate) + collectives, per GPU:
        bytes = BF16 non-expert weights / TP
              + BF16 routed experts / G x (1 - (1 - k / E_x)^b)  (each local expert is read
                when at least one of the step's b tokens routes to it, k of E_x each)
              + ceil(b / (G / TP)) x KV of a sequence at c tokens  (`kv_bytes_per_sequence`)
        FLOPs = b x (2 x active matmul params + layers x 2 x heads x c_att x (d_qk + d_v)) / G,
                c_att = min(c, window, DSA top-k)
        collectives (`DecodeCosts.collectives`): per layer an all-reduce over TP after
                attention, and for the MLP another (plain TP) or a dispatch and a combine over
                the engine's G GPUs, of the step's ceil(b / (G / TP)) tokens x hidden x 2 B
                (x top-k routed with EP), priced by
                `LayoutCosts` (NCCL rates of the node, `Efficiency.launch_s` each: at decode
                sizes they are latency, not bandwidth)
    round    = prefill + decode (prefill is not overlapped with decode: an upper bound)

Every sequence is taken to reach its full response length (RL rollouts' long tail sets the
round's time). Rates: the node's GPU from `catalog/hardware/gpus.toml` (H200: 4.8 TB/s HBM,
790 TFLOP/s BF16 matmul, each with its source), links from `catalog/clusters/*.toml`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slide_ir.ir.graph import OpKind, Work
from slide_ir.layouts.cluster import Cluster
from slide_ir.layouts.cost import LayoutCosts
from slide_ir.layouts.plan import Layout
from slide_ir.layouts.rollout import (
    Engine,
    EngineLedger,
    RolloutWork,
    build_engine_ledger,
    expert_params,
    kv_bytes_per_sequence,
)
from slide_ir.layouts.work import BF16
from slide_ir.specs import moe
from slide_ir.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutTime:
    engines: int
    sequences_per_engine: int
    batch: int  # decode batch per engine (the first waves)
    waves: int
    prefill_s: float
    decode_s: float
    step_s: float  # one decode step of a full wave at the mean context
    bound: str  # what bounds that step: "memory" or "compute"
    decode_tokens_per_s_per_gpu: float

    @property
    def round_s(self) -> float:
        return self.prefill_s + self.decode_s


def _layers(spec: ModelSpec) -> range:
    return range(1, spec.num_layers + 1)


def prefill_flops(spec: ModelSpec, prompt: int) -> tuple[float, float]:
    """(FLOPs, of which attention) of one prompt's prefill, the whole model."""
    attn = moe.attention_fwd_flops(spec, 1, prompt) * spec.num_layers
    linear = sum(2.0 * prompt * moe.active_matmul_params(spec, i) for i in _layers(spec))
    return linear + attn + 2.0 * spec.hidden_size * spec.vocab_size, attn


def _attended(spec: ModelSpec, context: float) -> float:
    """Keys one decoding query attends to: the context, capped by a window or DSA's top-k."""
    caps = [context, spec.sliding_window or math.inf, moe.dsa_indexer(spec)[0] or math.inf]
    return min(caps)


class DecodeCosts:
    """t_step(b, c) of one engine on `cluster` (module docstring)."""

    __slots__ = ("active", "comm", "dense", "eng", "experts", "spec")

    def __init__(self, spec: ModelSpec, eng: Engine, cluster: Cluster) -> None:
        self.spec, self.eng = spec, eng
        routed = expert_params(spec)
        self.dense = BF16 * -(-(spec.total_params - routed) // eng.tp)
        self.experts = BF16 * -(-routed // eng.gpus)
        self.active = sum(moe.active_matmul_params(spec, i) for i in _layers(spec))
        proxy = Layout(gpus=eng.gpus, tp=eng.tp, ep=eng.gpus, dp=eng.attention_dp)  # ep: all G
        self.comm = LayoutCosts(cluster, proxy)

    def expert_share(self, batch: int) -> float:
        """Share of local experts a step of `batch` tokens reads: 1 - (1 - k / E)^b."""
        s = self.spec
        return 1.0 - (1.0 - s.experts_per_token / s.num_experts) ** batch if s.is_moe else 0.0

    def collectives(self, batch: int) -> float:
        """Seconds of one step's collectives: per layer the attention's all-reduce over TP, and
        the MLP's: an all-reduce over TP when the engine is plain TP (G = TP, EP = 1), else a
        dispatch and a combine over all G GPUs (EP, or DP attention gathering its tokens for
        the experts' TP), routed tokens x k on MoE layers with EP."""
        s, e, c = self.spec, self.eng, self.comm
        message = -(-batch // e.attention_dp) * s.hidden_size * BF16
        launch = c.base.efficiency.launch_s
        reduce = (launch + c.collective_seconds(OpKind.ALL_REDUCE, "tp", message)) * (e.tp > 1)
        if e.gpus == e.tp and e.ep == 1:
            return 2 * s.num_layers * reduce
        total = s.num_layers * reduce
        for i in _layers(s):
            routed = message * (s.experts_per_token if moe.is_moe_layer(s, i) and e.ep > 1 else 1)
            total += 2 * (launch + c.collective_seconds(OpKind.ALL_TO_ALL, "ep", routed))
        return total

    def step(self, batch: int, context: float) -> tuple[float, str]:
        """(seconds, bound) of one decode step of `batch` sequences per engine at `context`."""
        s, e, r = self.spec, self.eng, self.comm.base.rates
        kv = -(-batch // e.attention_dp) * kv_bytes_per_sequence(s, e, math.ceil(context))
        nbytes = self.dense + self.experts * self.expert_share(batch) + kv
        v = s.v_head_dim or s.head_dim
        attn = s.num_layers * 2.0 * s.num_heads * _attended(s, context) * (s.head_dim + v)
        flops = batch * (2.0 * self.active + attn) / e.gpus
        memory, compute = nbytes / r.hbm, flops / r.flops
        bound = "memory" if memory >= compute else "compute"
        return max(memory, compute) + self.collectives(batch), bound


def rollout_time(
    spec: ModelSpec, eng: Engine, work: RolloutWork, cluster: Cluster, engines: int,
    ledger: EngineLedger | None = None,
) -> RolloutTime:  # fmt: skip
    """One round on `engines` engines (module docstring); `ledger`: the engine's, if built."""
    led = ledger or build_engine_ledger(spec, eng, work, cluster, engines)
    n, b = work.per_engine(engines), max(led.batch, 1)
    costs = DecodeCosts(spec, eng, cluster)
    flops, attn = prefill_flops(spec, work.prompt_len)
    prompts = -(-n // work.samples)
    prefill = costs.comm.base.compute_seconds(
        Work(flops=prompts * flops / eng.gpus, attn_flops=prompts * attn / eng.gpus)
    )
    mean = work.prompt_len + (work.response_len + 1) / 2
    waves, last = divmod(n, b)
    batches = [b] * waves + ([last] if last else [])
    decode = sum(work.response_len * costs.step(x, mean)[0] for x in batches)
    step, bound = costs.step(b, mean)
    return RolloutTime(
        engines=engines,
        sequences_per_engine=n,
        batch=b,
        waves=len(batches),
        prefill_s=prefill,
        decode_s=decode,
        step_s=step,
        bound=bound,
        decode_tokens_per_s_per_gpu=n * work.response_len / decode / eng.gpus,
    )
