"""`slide train`'s request: every flag the command line (or `--config`) resolved, in one frozen
record that each stage of the run reads and none changes (a saved plan's config, once read, is
put in its place with `dataclasses.replace`). It imports no torch: the CLI builds and checks a
request before anything heavy is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slide_ir.specs.config import TrainConfig


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    model: str
    machine: str
    config: TrainConfig
    ram_gb: float | None = None
    nvme: int | None = None
    nvme_dirs: tuple[str, ...] = ()
    data: str | None = None
    tokenizer: str | None = None
    data_cache: str | None = None  # token caches' directory [~/.cache/slide/tokens]
    truncation: str = "truncate"  # chat data: conversations longer than seq, cut or dropped
    eval_data: str | None = None  # the eval set's file (any --data format)
    eval_fraction: float | None = None  # or this fraction of the data's windows, held out
    eval_every: int | None = None  # steps between evals (None: only after the last step)
    eval_batches: int = 16  # batches an eval reads at most (0: the whole eval set)
    packing: str = "stream"  # `slide.packing.PACKING`: one stream in windows, or documents apart
    shuffle: bool = True
    seed: int = 0
    device: str | None = None
    dtype: str | None = None
    lr: float = 1e-5
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    out: str | None = None
    overwrite: bool = False
    save_every: int = 0
    keep: int = 2
    resume: str | None = None
    extend_schedule: bool = False
    metrics: str | None = None
    tensorboard: str | None = None  # a directory for the metrics as TensorBoard scalars
    plan_file: str | None = None  # a saved plan: its model, machine and config (but steps) win
    trace: str | None = None
    # the steps --trace/--gantt/--save-trace show; None: `executor.recording.default_trace_steps`
    trace_steps: tuple[int, int] | None = None
    log_every: int = 10  # metrics add tokens/s and lane busy shares over every N steps
    max_skipped_steps: int = 10  # global clipping: non-finite steps in a row that stop the run
    gantt: str | None = None
    save_trace: str | None = None  # the measured Trace in Slide's format (for compare-trace)
    progress: bool = True
    # after the first steady steps, re-fit the profile to the measured lanes and move to the
    # placement the search then prefers (CUDA runs planned here, not from a saved plan)
    replan: bool = True
    # said once (rank 0) when every check has passed, before the weights are touched: what the
    # run would otherwise do without a word (`slide.commands.train_inputs.notices`)
    notices: tuple[str, ...] = ()
    # the flags the run resolved, by config key (`slide.run_config`): written to OUT/config.toml
    # and the first metrics line, so `slide train --config OUT/config.toml` repeats the run
    run_config: dict[str, Any] | None = None
