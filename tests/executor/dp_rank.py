"""One rank of the data-parallel tests, started as torchrun starts one (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment): `python dp_rank.py OUT CASE [CASE ...]`.

Each case trains the tiny model of `runs` on a global batch of `GLOBAL_BATCH` rows with
`train(ranks=...)`; rank 0 writes its losses and final state to OUT/<case>.pt. Case `resume`
saves at step 2 (rank 0 writes the checkpoint, every rank reads it back) and runs steps 3-4
from it. Case `fail` raises on rank 1 at step 2: both processes must exit, rank 0 naming it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from hf_models import hf_model, spec_of, state_dict_fp32, tiny_config
from runs import LR, MACHINE, model_config

from executor.adam import AdamWConfig
from executor.ranks import init_from_env
from executor.run import TrainResult
from slide.session import train
from slide_ir import TrainConfig, load_machine

GLOBAL_BATCH, SEQ, STEPS = 6, 16, 4  # 6 rows: 2 or 3 ranks take 3 or 2 each
# Qwen2 with its q/k/v biases and tied embeddings, 4 layers
QWEN2_TIED = tiny_config("qwen2", num_hidden_layers=4, rope_scaling=None)
# case -> (the model: tied runs' llama, untied, or the Qwen2 config; the TrainConfig's choices)
CASES: dict[str, tuple[bool | dict, dict]] = {
    "sliding": (False, {}),
    "tied-sliding": (True, {}),
    "qwen2-tied-resident": (QWEN2_TIED, {"resident": 1}),
    "tied-resident-clip-accum": (
        True,
        {"resident": 2, "clip": "per-unit", "clip_norm": 0.05, "grad_accum": 2},
    ),
    "tied-streamed": (True, {"streamed": 2}),
    "host-inputs-clip": (
        False,
        {"activations": "cpu", "streamed": 0, "clip": "per-unit", "clip_norm": 0.05},
    ),
    "nvme-optimizer": (True, {"optimizer": "nvme", "drives": 2}),
    "nvme-activations-moments": (
        False,
        {"activations": "nvme", "optimizer": "nvme-moments", "drives": 2},
    ),
    # global clipping: norms of resident units on the GPU after their reduce-scatter, of host
    # units from their landed shards; the squares summed over the ranks
    "tied-resident-global-clip-accum": (
        True,
        {"resident": 2, "clip": "global", "clip_norm": 0.05, "grad_accum": 2},
    ),
    "kept-tapes": (True, {"keep_activations": 2}),  # the top 2 layers' forwards keep tapes
    "fast": (False, {"placement": "fast"}),  # what the placement search picks
    # packed documents: each rank stages its rows' positions and builds their masks
    "documents": (False, {"documents": True}),
}


def data(n: int, first: int = 0, documents: bool = False) -> list[tuple[torch.Tensor, ...]]:
    """Micro-batches first .. first + n - 1 of the global data (some labels ignored); packed
    documents: row r of micro-batch i holds documents of 3 + (r + i) % 5 tokens."""
    g = torch.Generator().manual_seed(0)
    out: list[tuple[torch.Tensor, ...]] = []
    for i in range(first + n):
        ids = torch.randint(0, 512, (GLOBAL_BATCH, SEQ), generator=g)
        labels = torch.randint(0, 512, (GLOBAL_BATCH, SEQ), generator=g)
        labels[i % GLOBAL_BATCH, : i % 5] = -100
        lengths = 3 + (torch.arange(GLOBAL_BATCH)[:, None] + i) % 5
        positions = torch.arange(SEQ) % lengths  # (GLOBAL_BATCH, SEQ)
        out.append((ids, labels, positions) if documents else (ids, labels))
    return out[first:]


def run_case(case: str, ranks, tmp: Path, steps: int = STEPS, **kwargs) -> TrainResult:  # type: ignore[no-untyped-def]
    """`case` on this process's ranks (None: one process, the reference)."""
    config = CASES[case][1]
    config = {"placement": "small", **config}
    drives = int(config.pop("drives", 0))
    documents = bool(config.pop("documents", False))
    grad_accum = int(config.get("grad_accum", 1))
    cfg = model_of(case)
    first = kwargs.pop("start_step", 0)
    kwargs.setdefault("initial_state", state_dict_fp32(hf_model(cfg)))
    return train(
        spec_of(cfg),
        load_machine(MACHINE, nvme=drives),
        TrainConfig(batch=GLOBAL_BATCH, seq=SEQ, steps=steps, document_mask=documents, **config),
        optim=AdamWConfig(lr=LR),
        batches=data(steps * grad_accum, first * grad_accum, documents),
        device="cpu",
        dtype=torch.float32,
        nvme_dir=tmp,
        ranks=ranks,
        start_step=first,
        **kwargs,
    )


def model_of(case: str) -> dict:
    """The HF config of `case`'s model."""
    model = CASES[case][0]
    return model if isinstance(model, dict) else model_config(model)


def _resume(ranks, out: Path) -> TrainResult:  # type: ignore[no-untyped-def]
    saved = out / "resume-step2.pt"

    def on_save(step: int, read_state) -> None:  # type: ignore[no-untyped-def]
        weights, moments = read_state()
        torch.save({"weights": dict(weights), "moments": dict(moments), "step": step}, saved)

    run_case("sliding", ranks, out, steps=3, save_every=2, on_save=on_save)
    torch.distributed.barrier()  # rank 0 has written the checkpoint
    state = torch.load(saved)
    return run_case("sliding", ranks, out, steps=2, start_step=state["step"],
                    initial_state=state["weights"], initial_optim_state=state["moments"])  # fmt: skip


def _fail(ranks, out: Path) -> TrainResult:  # type: ignore[no-untyped-def]
    def on_step(step: int, loss: float, lr: float, metrics: dict) -> None:
        if ranks.rank == 1 and step == 2:
            raise ValueError("boom at step 2")

    return run_case("sliding", ranks, out, on_step=on_step)


def main() -> None:
    out, cases = Path(sys.argv[1]), sys.argv[2:]
    ranks = init_from_env("cpu")
    assert ranks is not None, "started without WORLD_SIZE > 1"
    for case in cases:
        tmp = out / f"{case}.rank{ranks.rank}"
        tmp.mkdir(parents=True, exist_ok=True)
        if case == "resume":
            result = _resume(ranks, out)
        elif case == "fail":
            result = _fail(ranks, tmp)
        else:
            result = run_case(case, ranks, tmp)
        record = {"losses": result.losses, "state": result.final_state, "trace": result.trace.to_json(),
                  "steps": result.steps_done}  # fmt: skip
        torch.save(record, out / f"{case}.rank{ranks.rank}.pt")
    ranks.close()


if __name__ == "__main__":
    main()
