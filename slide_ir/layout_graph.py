"""One training step of a layout as a schedule Graph: 1F1B over the pipeline stages, the
collectives of each dimension on `net` lanes, the update on the GPU or the host.

Each stage is represented by one of its GPUs (all GPUs of a stage do the same work). Per
micro-batch j on stage s (ids `s1.m{j}.S{s}.*`):
- `fwd` on `gpu{s}` waits for the previous stage's `pp.fwd` send; the CP key/value ring
  (`cp.fwd`) starts with it on its own lane (ring attention overlaps it with compute); the TP
  and EP collectives follow the compute and block the stream (the next compute op waits for
  them); `pp.fwd` sends the output to stage s + 1 once all of them are done;
- backward mirrors it (`recompute` first under recompute), ending with `pp.bwd` to s - 1.
1F1B: stage s runs min(p - s - 1, m) warm-up forwards, then alternates one forward and one
backward, then drains. The pool `acts{s}` has min(p - s, m) slots: a forward takes one, its
backward frees it. After its last backward a stage
reduces its gradients over DP (reduce-scatter when the optimizer is sharded, else
all-reduce; experts over their own group), updates (GPU AdamW, or PCIe down, host AdamW, PCIe
up with --cpu-adam) and all-gathers the updated weights when sharded. ZeRO-3 also all-gathers
weights before every forward and backward and reduce-scatters gradients after each backward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from slide_ir.builder import GraphBuilder
from slide_ir.graph import Graph, GraphInfo, OpKind, Pool, Tier, Work
from slide_ir.layout import Layout
from slide_ir.layout_cost import net_lane
from slide_ir.layout_ledger import stage_terms
from slide_ir.layout_work import BF16, FP32, StageWork, all_stages, model_flops_per_step
from slide_ir.model import ModelSpec

K = OpKind


def one_f_one_b(pp: int, m: int, stage: int) -> list[tuple[str, int]]:
    """The 1F1B order of one stage: [("F", 0), ("F", 1), ("B", 0), ...]."""
    warm = min(pp - stage - 1, m)
    order = [("F", j) for j in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", j) for j in range(m - warm, m)]


class _Emitter:
    def __init__(self, spec: ModelSpec, lay: Layout, works: list[StageWork]) -> None:
        self.lay, self.works = lay, works
        pools = []
        for w in works:
            terms, _, in_flight = stage_terms(w, lay)
            kept = w.input_bytes if lay.recompute else w.act_bytes
            pools.append(Pool(name=f"acts{w.stage}", tier=Tier.GPU, slots=in_flight,
                              slot_bytes=kept))  # fmt: skip
            static = sum(v for k, v in terms.items() if k != "activations")
            pools.append(Pool(name=f"state{w.stage}", tier=Tier.GPU, slots=1,
                              slot_bytes=static, static=True))  # fmt: skip
        self.b = GraphBuilder(pools)
        self.blocking: dict[int, list[str]] = {w.stage: [] for w in works}  # exposed comm
        self.slot: dict[tuple[int, int], str] = {}

    def oid(self, s: int, j: int, what: str) -> str:
        return f"s1.m{j}.S{s}.{what}"

    def comm(self, op_id: str, kind: OpKind, s: int, dim: str, nbytes: int,
             deps: Sequence[str | None]) -> str | None:  # fmt: skip
        if nbytes <= 0:
            return None
        self.b.emit(op_id, kind, net_lane(s, dim), step=1, layer=s,
                    work=Work(bytes=nbytes), deps=deps)  # fmt: skip
        return op_id

    def compute(self, op_id: str, kind: OpKind, s: int, work: Work, deps: Sequence[str | None],
                **slots: list[str]) -> str:  # fmt: skip
        deps = [*deps, *self.blocking[s]]
        self.blocking[s] = []
        self.b.emit(op_id, kind, f"gpu{s}", step=1, layer=s, work=work, deps=deps, **slots)
        return op_id

    def gather_weights(self, s: int, j: int, what: str) -> list[str | None]:
        w = self.works[s]
        if self.lay.zero < 3:
            return []
        return [self.comm(self.oid(s, j, f"ag.{what}"), K.ALL_GATHER, s, "dp",
                          BF16 * w.dense_params, [])]  # fmt: skip

    def forward(self, s: int, j: int) -> None:
        w = self.works[s]
        ready: list[str | None] = [self.oid(s - 1, j, "pp.fwd")] if s else []
        ready += self.gather_weights(s, j, "fwd")
        work = Work(flops=w.fwd_flops, attn_flops=w.fwd_attn_flops, bytes=w.fwd_bytes)
        (slot,) = self.b.emit(self.oid(s, j, "fwd"), K.FWD, f"gpu{s}", step=1, layer=s,
                              work=work, deps=[*ready, *self.blocking[s]], acquire=[f"acts{s}"])  # fmt: skip
        self.blocking[s], self.slot[(s, j)] = [], slot
        self.after(s, j, "fwd", self.oid(s, j, "fwd"), ready, 1)

    def after(self, s: int, j: int, p: str, done: str, ready: Sequence[str | None], k: int) -> None:
        """Collectives of one pass: TP and EP block the stream, CP overlaps, PP sends."""
        w, lay = self.works[s], self.lay
        tp = self.comm(self.oid(s, j, f"tp.{p}"), K.ALL_REDUCE, s, "tp", w.tp_bytes, [done])
        ep = self.comm(self.oid(s, j, f"ep.{p}"), K.ALL_TO_ALL, s, "ep", w.ep_bytes,
                       [tp or done])  # fmt: skip
        cp = self.comm(self.oid(s, j, f"cp.{p}"), K.SEND_RECV, s, "cp", k * w.cp_bytes, ready)
        self.blocking[s] = [x for x in (tp, ep, cp) if x]
        to = s + 1 if p == "fwd" else s - 1
        if 0 <= to < lay.pp:
            self.comm(self.oid(s, j, f"pp.{p}"), K.SEND_RECV, s, "pp", w.pp_bytes,
                      [done, tp, ep, cp])  # fmt: skip

    def backward(self, s: int, j: int) -> None:
        w, lay = self.works[s], self.lay
        ready: list[str | None] = [self.oid(s + 1, j, "pp.bwd")] if s < lay.pp - 1 else []
        ready += self.gather_weights(s, j, "bwd")
        if lay.recompute:
            work = Work(flops=w.fwd_flops, attn_flops=w.fwd_attn_flops, bytes=w.fwd_bytes)
            self.compute(self.oid(s, j, "recompute"), K.RECOMPUTE, s, work, list(ready))
            self.blocking[s] = [x for x in (self.comm(self.oid(s, j, "tp.re"), K.ALL_REDUCE, s,
                                "tp", w.tp_bytes, [self.oid(s, j, "recompute")]),) if x]  # fmt: skip
        work = Work(flops=2 * w.fwd_flops, attn_flops=2 * w.fwd_attn_flops, bytes=2 * w.fwd_bytes)
        done = self.compute(self.oid(s, j, "bwd"), K.BWD, s, work, list(ready),
                            release=[self.slot.pop((s, j))])  # fmt: skip
        self.after(s, j, "bwd", done, ready, 2)
        if lay.zero >= 3:
            self.comm(self.oid(s, j, "rs"), K.REDUCE_SCATTER, s, "dp", FP32 * w.dense_params,
                      [done])  # fmt: skip

    def update(self, s: int) -> None:
        w, lay = self.works[s], self.lay
        last: list[str | None] = [self.oid(s, lay.m - 1, "bwd"), *self.blocking[s]]
        sharded = lay.optimizer_shards
        kind = K.REDUCE_SCATTER if sharded else K.ALL_REDUCE
        syncs = [
            self.comm(f"s1.S{s}.dp.grads", kind, s, "dp", FP32 * w.dense_params, last)
            if lay.zero < 3 else None,
            self.comm(f"s1.S{s}.edp.grads", kind, s, "edp", FP32 * w.expert_params, last),
        ]  # fmt: skip
        d = lay.data_parallel * lay.cp if sharded else 1
        shard = -(-w.dense_params // d) + -(-w.expert_params // (lay.expert_dp if sharded else 1))
        deps = [*last, *syncs]
        if lay.cpu_adam:
            self.b.emit(f"s1.S{s}.g.d2h", K.D2H_GRAD, f"d2h{s}", step=1, layer=s,
                        work=Work(bytes=FP32 * shard), deps=deps)  # fmt: skip
            self.b.emit(f"s1.S{s}.adam", K.ADAM, f"cpu{s}", step=1, layer=s,
                        work=Work(elements=shard, bytes=28 * shard), deps=[f"s1.S{s}.g.d2h"])  # fmt: skip
            self.b.emit(f"s1.S{s}.w.h2d", K.H2D_PARAM, f"h2d{s}", step=1, layer=s,
                        work=Work(bytes=BF16 * shard), deps=[f"s1.S{s}.adam"])  # fmt: skip
            updated = f"s1.S{s}.w.h2d"
        else:
            updated = self.compute(f"s1.S{s}.gpu_adam", K.GPU_ADAM, s,
                                   Work(elements=shard, bytes=16 * shard), deps)  # fmt: skip
        if sharded and lay.zero < 3:
            self.comm(f"s1.S{s}.dp.weights", K.ALL_GATHER, s, "dp", BF16 * w.dense_params,
                      [updated])  # fmt: skip
            self.comm(f"s1.S{s}.edp.weights", K.ALL_GATHER, s, "edp", BF16 * w.expert_params,
                      [updated])  # fmt: skip


def layout_graph(spec: ModelSpec, lay: Layout, machine: str) -> Graph:
    """The step's graph; every dependency is emitted before its dependant (a ready-first walk
    over the stages' 1F1B orders)."""
    works = all_stages(spec, lay)
    em = _Emitter(spec, lay, works)
    queues = {s: deque(one_f_one_b(lay.pp, lay.m, s)) for s in range(lay.pp)}
    done: set[tuple[str, int, int]] = set()
    while any(queues.values()):
        progressed = False
        for s, q in queues.items():
            while q and _ready(q[0], s, lay.pp, done):
                what, j = q.popleft()
                em.forward(s, j) if what == "F" else em.backward(s, j)
                done.add((what, s, j))
                progressed = True
        if not progressed:
            raise RuntimeError("1F1B orders deadlock: a bug in one_f_one_b")
    for s in range(lay.pp):
        em.update(s)
    info = GraphInfo(schedule="1f1b", model=spec.name, machine=machine,
                     batch=lay.micro_batch_size * lay.data_parallel, seq=lay.seq, steps=1,
                     grad_accum=lay.m, num_layers=spec.num_layers, params=spec.total_params,
                     flops_per_step=model_flops_per_step(spec, lay))  # fmt: skip
    return em.b.build(info)


def _ready(item: tuple[str, int], s: int, pp: int, done: set[tuple[str, int, int]]) -> bool:
    what, j = item
    if what == "F":
        return s == 0 or ("F", s - 1, j) in done
    return s == pp - 1 or ("B", s + 1, j) in done
