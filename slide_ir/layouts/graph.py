"""One training step of a layout as a schedule Graph: 1F1B (or interleaved 1F1B) over the
pipeline stages, the collectives of each dimension on `net` lanes, the update on the GPU or the
host.

Each stage is represented by one of its GPUs (all GPUs of a stage do the same work). With v = 1
the unit of work is a micro-batch j on stage s (ids `s1.m{j}.S{s}.*`); with v > 1 virtual
stages it is chunk c of micro-batch j (`s1.m{j}.S{s}.c{c}.*`), priced as 1/v of the stage's
work (compute, TP/EP/CP messages; the PP hop still carries a whole micro-batch's activation).
Per unit:
- `fwd` on `gpu{s}` waits for its input (`pp.fwd` of the previous stage, or of the last stage's
  previous chunk when c > 0); the CP key/value ring (`cp.fwd`) starts with it on its own lane
  (ring attention overlaps it with compute; allgather CP's gather follows the compute's
  collectives instead, exposed); the TP and EP collectives follow the compute and
  block the stream (the next compute op waits for them); `pp.fwd` sends the output on once all
  of them are done;
- backward mirrors it: under recompute a `recompute` pass first, with its own TP, EP and CP
  collectives (full recompute re-runs the forward's; selective recompute runs what its modules
  regenerate, `StageWork.re_*`, and with `moe` the EP dispatch and combine again); `bwd`;
  `pp.bwd` to the previous stage.
1F1B: stage s runs min(p - s - 1, m) warm-up forwards, then alternates one forward and one
backward, then drains. Interleaved (Megatron's order, m a multiple of p): forward k of stage s
is chunk (k mod pv) // p of micro-batch (k // pv) p + k mod p, backwards take the chunks in
reverse, with 2 (p - s - 1) + (v - 1) p warm-up forwards. The pool `acts{s}` has one slot per
forward in flight (`in_flight_chunks`): a forward takes one, its backward frees it. After its
last backward a stage reduces its gradients over DP (reduce-scatter when the optimizer is
sharded, else all-reduce; experts over their own group), updates (GPU AdamW, or PCIe down, host
AdamW, PCIe up with --cpu-adam) and all-gathers the updated weights when sharded. ZeRO-3 also
all-gathers weights before every forward and backward and reduce-scatters gradients after each
backward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from slide_ir.ir.graph import Graph, GraphInfo, OpKind, Pool, Tier, Work
from slide_ir.layouts.cost import net_lane
from slide_ir.layouts.ledger import stage_terms
from slide_ir.layouts.plan import Layout
from slide_ir.layouts.work import BF16, FP32, StageWork, all_stages, model_flops_per_step
from slide_ir.planning.builder import GraphBuilder
from slide_ir.specs.model import ModelSpec

K = OpKind
Unit = tuple[str, int, int]  # ("F" or "B", micro-batch, chunk)


def one_f_one_b(pp: int, m: int, stage: int) -> list[tuple[str, int]]:
    """The 1F1B order of one stage: [("F", 0), ("F", 1), ("B", 0), ...]."""
    warm = min(pp - stage - 1, m)
    order = [("F", j) for j in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", j) for j in range(m - warm, m)]


def interleaved_order(pp: int, m: int, v: int, stage: int) -> list[Unit]:
    """Megatron's interleaved 1F1B order of one stage as (pass, micro-batch, chunk); v = 1 is
    plain 1F1B. Needs m a multiple of pp when v > 1."""
    if v == 1:
        return [(what, j, 0) for what, j in one_f_one_b(pp, m, stage)]
    total = m * v
    warm = min(2 * (pp - stage - 1) + (v - 1) * pp, total)

    def unit(what: str, k: int) -> Unit:
        chunk = k % (pp * v) // pp
        return (what, k // (pp * v) * pp + k % pp, chunk if what == "F" else v - 1 - chunk)

    order = [unit("F", k) for k in range(warm)]
    for i in range(total - warm):
        order += [unit("F", warm + i), unit("B", i)]
    return order + [unit("B", k) for k in range(total - warm, total)]


def _scaled(w: StageWork, v: int) -> tuple[Work, int, int, int]:
    """(forward work, TP, EP, CP message) of one chunk: 1/v of the stage's."""
    work = Work(flops=w.fwd_flops / v, attn_flops=w.fwd_attn_flops / v, bytes=w.fwd_bytes // v)
    return work, w.tp_bytes // v, w.ep_bytes // v, w.cp_bytes // v


class _Emitter:
    def __init__(self, lay: Layout, works: list[StageWork]) -> None:
        self.lay, self.works, self.v = lay, works, lay.virtual_stages
        pools = []
        for w in works:
            terms, _, in_flight = stage_terms(w, lay)
            kept = w.input_bytes if lay.recompute else w.act_bytes
            pools.append(Pool(name=f"acts{w.stage}", tier=Tier.GPU, slots=in_flight,
                              slot_bytes=-(-kept // self.v)))  # fmt: skip
            static = sum(v for k, v in terms.items() if k != "activations")
            pools.append(Pool(name=f"state{w.stage}", tier=Tier.GPU, slots=1,
                              slot_bytes=static, static=True))  # fmt: skip
        self.b = GraphBuilder(pools)
        self.blocking: dict[int, list[str]] = {w.stage: [] for w in works}  # exposed comm
        self.slot: dict[tuple[int, int, int], str] = {}
        self.last: dict[int, str] = {}

    def oid(self, s: int, j: int, c: int, what: str) -> str:
        chunk = f".c{c}" if self.v > 1 else ""
        return f"s1.m{j}.S{s}{chunk}.{what}"

    def comm(self, op_id: str, kind: OpKind, s: int, dim: str, nbytes: int,
             deps: Sequence[str | None]) -> str | None:  # fmt: skip
        if nbytes <= 0:
            return None
        self.b.emit(op_id, kind, net_lane(s, dim), step=1, unit=s,
                    work=Work(bytes=nbytes), deps=deps)  # fmt: skip
        return op_id

    def compute(self, op_id: str, kind: OpKind, s: int, work: Work, deps: Sequence[str | None],
                acquire: Sequence[str] = (), release: Sequence[str] = ()) -> str:  # fmt: skip
        deps = [*deps, *self.blocking[s]]
        self.blocking[s] = []
        self.b.emit(op_id, kind, f"gpu{s}", step=1, unit=s, work=work, deps=deps,
                    acquire=acquire, release=release)  # fmt: skip
        self.last[s] = op_id
        return op_id

    def gather_weights(self, s: int, j: int, c: int, what: str) -> list[str | None]:
        if self.lay.zero < 3:
            return []
        nbytes = BF16 * self.works[s].dense_params // self.v
        return [self.comm(self.oid(s, j, c, f"ag.{what}"), K.ALL_GATHER, s, "dp", nbytes, [])]

    def source(self, s: int, j: int, c: int, what: str) -> list[str | None]:
        """The send this unit's input comes from (none for the first forward / last backward)."""
        p, v = self.lay.pp, self.v
        if what == "fwd":
            prev = (s - 1, c) if s else (p - 1, c - 1)
            return [self.oid(prev[0], j, prev[1], "pp.fwd")] if prev[1] >= 0 else []
        nxt = (s + 1, c) if s < p - 1 else (0, c + 1)
        return [self.oid(nxt[0], j, nxt[1], "pp.bwd")] if nxt[1] < v else []

    def forward(self, s: int, j: int, c: int) -> None:
        work, *_ = _scaled(self.works[s], self.v)
        ready = self.source(s, j, c, "fwd") + self.gather_weights(s, j, c, "fwd")
        done = self.compute(self.oid(s, j, c, "fwd"), K.FWD, s, work, ready,
                            acquire=[f"acts{s}"])  # fmt: skip
        self.slot[(s, j, c)] = self.b.ops[-1].acquires[0]
        self.after(s, j, c, "fwd", done, ready)

    def after(self, s: int, j: int, c: int, p: str, done: str, ready: Sequence[str | None],
              messages: tuple[int, int, int] | None = None) -> None:  # fmt: skip
        """Collectives of one pass: TP and EP block the stream, CP overlaps, PP sends on.
        `messages`: (TP, EP, CP) bytes when not the forward's (selective recompute)."""
        _, tp_b, ep_b, cp_b = _scaled(self.works[s], self.v)
        if messages is not None:
            tp_b, ep_b, cp_b = messages
        tp = self.comm(self.oid(s, j, c, f"tp.{p}"), K.ALL_REDUCE, s, "tp", tp_b, [done])
        ep = self.comm(self.oid(s, j, c, f"ep.{p}"), K.ALL_TO_ALL, s, "ep", ep_b, [tp or done])
        ring = cp_b * (2 if p == "bwd" else 1)  # backward sends K, V and their gradients
        # the zigzag ring starts with the compute; allgather CP's gather is exposed, serial
        cp_deps = ready if self.lay.cp_comm == "zigzag" else [ep or tp or done]
        cp = self.comm(self.oid(s, j, c, f"cp.{p}"), K.SEND_RECV, s, "cp", ring, cp_deps)
        self.blocking[s] = [x for x in (tp, ep, cp) if x]
        if p == "re":
            return
        last_fwd = s == self.lay.pp - 1 and c == self.v - 1
        if (p == "fwd" and not last_fwd) or (p == "bwd" and (s, c) != (0, 0)):
            self.comm(self.oid(s, j, c, f"pp.{p}"), K.SEND_RECV, s, "pp",
                      self.works[s].pp_bytes, [done, tp, ep, cp])  # fmt: skip

    def backward(self, s: int, j: int, c: int) -> None:
        w, lay = self.works[s], self.lay
        work, *_ = _scaled(w, self.v)
        ready = self.source(s, j, c, "bwd") + self.gather_weights(s, j, c, "bwd")
        if lay.recompute:
            re = self.compute(self.oid(s, j, c, "recompute"), K.RECOMPUTE, s, work, ready)
            self.after(s, j, c, "re", re, ready)
        elif lay.recompute_modules:  # selective: the modules' forward again, MoE's all-to-all
            part = Work(flops=w.re_flops / self.v, bytes=w.re_bytes // self.v)
            re = self.compute(self.oid(s, j, c, "recompute"), K.RECOMPUTE, s, part, ready)
            self.after(s, j, c, "re", re, ready, messages=(0, w.re_ep_bytes // self.v, 0))
        twice = Work(flops=2 * work.flops, attn_flops=2 * work.attn_flops, bytes=2 * work.bytes)
        done = self.compute(self.oid(s, j, c, "bwd"), K.BWD, s, twice, ready,
                            release=[self.slot.pop((s, j, c))])  # fmt: skip
        self.after(s, j, c, "bwd", done, ready)
        if lay.zero >= 3:
            self.comm(self.oid(s, j, c, "rs"), K.REDUCE_SCATTER, s, "dp",
                      FP32 * w.dense_params // self.v, [done])  # fmt: skip

    def update(self, s: int) -> None:
        w, lay = self.works[s], self.lay
        last: list[str | None] = [self.last[s], *self.blocking[s]]
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
            self.b.emit(f"s1.S{s}.g.d2h", K.D2H_GRAD, f"d2h{s}", step=1, unit=s,
                        work=Work(bytes=FP32 * shard), deps=deps)  # fmt: skip
            self.b.emit(f"s1.S{s}.adam", K.ADAM, f"cpu{s}", step=1, unit=s,
                        work=Work(elements=shard, bytes=28 * shard), deps=[f"s1.S{s}.g.d2h"])  # fmt: skip
            self.b.emit(f"s1.S{s}.w.h2d", K.H2D_PARAM, f"h2d{s}", step=1, unit=s,
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
    over the stages' orders)."""
    works = all_stages(spec, lay)
    em = _Emitter(lay, works)
    p, v = lay.pp, lay.virtual_stages
    queues = {s: deque(interleaved_order(p, lay.m, v, s)) for s in range(p)}
    done: set[tuple[str, int, int, int]] = set()
    while any(queues.values()):
        progressed = False
        for s, q in queues.items():
            while q and _ready(q[0], s, p, v, done):
                what, j, c = q.popleft()
                em.forward(s, j, c) if what == "F" else em.backward(s, j, c)
                done.add((what, s, j, c))
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline orders deadlock: a bug in interleaved_order")
    for s in range(p):
        em.update(s)
    info = GraphInfo(schedule="1f1b" if v == 1 else f"interleaved-1f1b-v{v}", model=spec.name,
                     machine=machine, batch=lay.micro_batch_size * lay.data_parallel,
                     seq=lay.seq, steps=1, grad_accum=lay.m, num_layers=spec.num_layers,
                     params=spec.total_params,
                     flops_per_step=model_flops_per_step(spec, lay))  # fmt: skip
    return em.b.build(info)


def _ready(unit: Unit, s: int, p: int, v: int, done: set[tuple[str, int, int, int]]) -> bool:
    what, j, c = unit
    if what == "F":
        if s:
            return ("F", s - 1, j, c) in done
        return c == 0 or ("F", p - 1, j, c - 1) in done
    if s < p - 1:
        return ("B", s + 1, j, c) in done
    return c == v - 1 or ("B", 0, j, c + 1) in done
