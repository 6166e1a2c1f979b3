"""What `slide train` reports: the progress bar and the metrics file as steps end, and the
summary, trace files and Gantt chart at the end (aggregates, never lists as long as the run)."""

from __future__ import annotations

import json
import math
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor.phases import Phases
from executor.run import TrainResult
from slide import json_out
from slide.fileio import write_atomic
from slide.tensorboard_scalars import Scalars
from slide_ir.ir.trace import Metrics, to_chrome_trace, trace_metrics
from slide_ir.planning.speculation import expected
from slide_ir.specs.hardware import Machine

if TYPE_CHECKING:
    from slide.train_request import TrainRequest

# the phases a summary reports, in order; `to_first_step_s` sums the start-up ones
STARTUP = (
    "imports",
    "model spec",
    "machine",
    "resume",
    "plan",
    "data",
    "weights source",
    "output directory",
    "engine check",
    "buffers",
    "state",
    "first step",
)
SHUTDOWN = ("steps", "save", "release", "report")


@dataclass
class LossStats:
    """Running aggregates of the run's losses: the summary never grows with the step count."""

    steps: int = 0
    first: float | None = None
    last: float | None = None
    total: float = 0.0
    lowest: float = math.inf

    def add(self, loss: float) -> None:
        self.steps += 1
        self.first = loss if self.first is None else self.first
        self.last, self.total, self.lowest = loss, self.total + loss, min(self.lowest, loss)

    def summary(self) -> dict[str, Any]:
        mean = self.total / self.steps if self.steps else None
        lowest = self.lowest if self.steps else None
        return {"loss_first": self.first, "loss_last": self.last, "loss_mean": mean,
                "loss_min": lowest}  # fmt: skip


@dataclass
class ClipCounts:
    """Global clipping over the run: steps clipped (norm above `--clip-norm`) or skipped (not
    finite). Under speculation each of them rolled its speculated updates back."""

    steps: int = 0  # steps with a global norm
    clipped: int = 0  # clipped or skipped
    skipped: int = 0

    def add(self, metrics: dict[str, Any]) -> None:
        if "grad_norm" in metrics:
            self.steps += 1
            self.clipped += bool(metrics.get("clipped"))
            self.skipped += bool(metrics.get("skipped"))

    def summary(self, placement: dict[str, Any] | None) -> dict[str, Any]:
        """`clipping` for the run's summary (nothing without global clipping)."""
        if not self.steps:
            return {}
        speculated = ((placement or {}).get("speculation") or {}).get("speculated_units", 0)
        out = {"steps": self.steps, "clipped_steps": self.clipped - self.skipped,
               "skipped_steps": self.skipped, "speculated_units": speculated}  # fmt: skip
        if speculated:
            out["rolled_back_steps"] = self.clipped
        return {"clipping": out}


GIB = 2**30
WARN_MEMORY = 0.05  # a host peak this far above the ledger is said: RAM was sized by it


def memory_summary(
    placement: dict[str, Any] | None, host_rss: int, gpu_reserved: int
) -> dict[str, Any]:
    """The run's peak host RSS (the process's high-water mark, start-up included) and the most
    GPU memory torch's allocator held (0: no CUDA), each set against the ledger's peak for its
    tier where the run was planned for this machine (`planned_bytes`; none in CPU mode or for
    data-parallel ranks)."""
    planned = (placement or {}).get("planned_bytes") or {}
    out: dict[str, Any] = {"host_peak_rss_gib": round(host_rss / GIB, 3)}
    if gpu_reserved:
        out["gpu_peak_reserved_gib"] = round(gpu_reserved / GIB, 3)
    for tier, name, measured in (("cpu", "host", host_rss), ("gpu", "gpu", gpu_reserved)):
        if planned.get(tier) and measured:
            out[f"{name}_planned_gib"] = round(planned[tier] / GIB, 3)
            out[f"{name}_vs_plan"] = round(measured / planned[tier] - 1, 4)
    if planned.get("nvme"):
        out["nvme_planned_gib"] = round(planned["nvme"] / GIB, 3)
    return {"memory": out}


def gpu_peak_reserved_bytes() -> int:
    """The most GPU memory torch's caching allocator held at once here (0 where CUDA is unused)."""
    import torch

    return int(torch.cuda.max_memory_reserved()) if torch.cuda.is_initialized() else 0


def peak_rss_bytes() -> int:
    """This process's peak resident set (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_warning(summary: dict[str, Any]) -> str | None:
    """One line when the host held more than `WARN_MEMORY` above what the ledger planned."""
    memory = summary.get("memory", {})
    over = memory.get("host_vs_plan")
    if over is None or over <= WARN_MEMORY:
        return None
    return (
        f"the host's peak RSS was {memory['host_peak_rss_gib']:.1f} GiB, {over:.1%} above the "
        f"{memory['host_planned_gib']:.1f} GiB the plan's ledger holds: leave that much more "
        "RAM free for this run"
    )


@dataclass
class Reporter:
    """Progress bar, metrics JSONL (one line per optimizer step) and TensorBoard scalars. A
    resumed run continues its metrics file from the checkpoint's step (lines a crash left
    beyond it are dropped)."""

    req: TrainRequest
    total: int
    start: int
    phases: Phases = field(default_factory=Phases)
    losses: LossStats = field(default_factory=LossStats)
    evals: LossStats = field(default_factory=LossStats)  # the eval losses (`executor.evaluation`)
    clipping: ClipCounts = field(default_factory=ClipCounts)

    def __post_init__(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=self.total, initial=self.start, unit="step", disable=not self.req.progress,
            desc="train", dynamic_ncols=True,
        )  # fmt: skip
        self.shown: dict[str, str] = {}  # the bar's figures
        self.metrics = None
        if self.req.metrics:
            Path(self.req.metrics).parent.mkdir(parents=True, exist_ok=True)
            if self.req.resume:
                keep_metrics_until(Path(self.req.metrics), self.start)
            self.metrics = open(self.req.metrics, "a" if self.req.resume else "w", encoding="utf-8")  # noqa: SIM115
        self.scalars = None
        if self.req.tensorboard:
            at = self.start if self.req.resume else None
            self.scalars = Scalars(self.req.tensorboard, resumed_at=at)

    def on_step(self, step: int, loss: float, lr: float, metrics: dict[str, Any]) -> None:
        if not self.losses.steps:  # the lanes started at the "lanes" mark
            self.phases.add("first step", self.phases.since("lanes"))
        self.phases.mark("first step end")
        self.losses.add(loss)
        self.clipping.add(metrics)
        self.bar.update(1)
        self._postfix(loss=f"{loss:.4f}", tok_s=f"{metrics.get('tokens_per_s', 0):,.0f}")
        row = {"step": step, "loss": loss, "lr": lr, **metrics}
        if self.metrics and self.losses.steps == 1 and self.req.run_config is not None:
            row["config"] = self.req.run_config  # how the run was made, once
        self._write(row)
        if self.scalars:
            self.scalars.write(step, row)

    def on_eval(self, step: int, loss: float, figures: dict[str, Any]) -> None:
        """An eval's line (`eval_loss`, `eval_tokens`, `eval_batches`, `eval_s`) after its
        step's, and its `eval/` scalars."""
        self.evals.add(loss)
        self._postfix(eval_loss=f"{loss:.4f}")
        row = {"step": step, "eval_loss": loss, **figures}
        self._write(row)
        if self.scalars:
            self.scalars.write(step, row, group="eval")

    def _postfix(self, **shown: str) -> None:
        """The bar's figures, the last eval's beside each step's."""
        self.shown |= shown
        self.bar.set_postfix(self.shown)

    def _write(self, row: dict[str, Any]) -> None:
        if self.metrics:
            self.metrics.write(json_out.dumps(row) + "\n")
            self.metrics.flush()

    def close(self) -> None:
        self.bar.close()
        if self.metrics:
            self.metrics.close()
        if self.scalars:
            self.scalars.close()


def keep_metrics_until(path: Path, step: int) -> None:
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line a kill cut short
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line + "\n")
    write_atomic(path, "".join(kept))


def finish(
    req: TrainRequest,
    result: TrainResult,
    reporter: Reporter,
    steps_done: int,
    machine: Machine,
    last: Path | None,
    *,
    interrupted: bool,
    nproc: int = 1,
) -> dict[str, Any]:
    """Trace files and the summary of this invocation (aggregates, not per-step lists). Data
    parallel: the trace is rank 0's; tokens/s counts every rank's rows."""
    if req.trace:
        write_atomic(req.trace, json_out.dumps(to_chrome_trace(result.trace)))
    if req.save_trace:
        write_atomic(req.save_trace, result.trace.to_json())
    if req.gantt:
        from slide.gantt import plot_gantt

        plot_gantt(result.trace, req.gantt, zoom="auto")
    m = trace_metrics(result.trace)
    tokens_per_s, step_s, steady = steady_rate(result.meta.get("steady"), m, nproc)
    placement = result.meta.get("placement")
    return {
        "steps_done": steps_done,
        "steps_run": reporter.losses.steps,
        "interrupted": interrupted or result.interrupted,
        "final_loss": reporter.losses.last,
        **reporter.losses.summary(),
        **eval_summary(reporter.evals),
        "machine": machine.name,
        **({"nproc": nproc} if nproc > 1 else {}),
        "tokens_per_s": tokens_per_s,
        "steady_steps": steady,
        **against_plan(placement, step_s, nproc, clipped_share(result.meta.get("steady"))),
        "eta": m.eta,
        **reporter.clipping.summary(placement),
        **memory_summary(placement, peak_rss_bytes(), gpu_peak_reserved_bytes()),
        "checkpoint": str(last) if last else None,
        **({"replan": result.meta["replan"]} if "replan" in result.meta else {}),
    }


def eval_summary(evals: LossStats) -> dict[str, Any]:
    """The last eval's loss (after the run's last step, unless it was stopped), the first and
    the lowest, and how many ran; nothing for a run without eval."""
    if not evals.steps:
        return {}
    return {"eval_loss": evals.last, "eval_loss_first": evals.first,
            "eval_loss_min": evals.lowest, "evals": evals.steps}  # fmt: skip


def steady_rate(steady: dict[str, Any] | None, m: Metrics, nproc: int) -> tuple[float, float, str]:
    """Tokens/s, seconds per step, and which steps they cover: every steady step of the run
    (`executor.progress.SteadySteps`: all ranks' tokens), or the trace window's where there was
    none (a one-step run)."""
    if steady and steady["steps"]:
        first, last = steady["first"], steady["first"] + steady["steps"] - 1
        return (
            steady["tokens"] / steady["seconds"],
            steady["seconds"] / steady["steps"],
            f"{first}-{last}",
        )
    return m.tokens_per_s * nproc, m.step_time_s, "trace window"


def clipped_share(steady: dict[str, Any] | None) -> float | None:
    """The share of the steady steps that global clipping clipped or skipped, None without
    steady steps."""
    if not steady or not steady["steps"]:
        return None
    return steady.get("clipped", 0) / steady["steps"]


def against_plan(
    placement: dict[str, Any] | None, step_s: float, nproc: int, clipped: float | None = None
) -> dict[str, Any]:
    """The placement the run ended on (the trace window's too, unless a run of under 10 steps
    moved after it), its predicted tokens/s and the measured step's error against it
    (positive: slower than predicted). With speculated updates the prediction is the kept
    and the rolled-back step mixed at the share of the steady steps that rolled back
    (`clipped`), not at the share the plan assumed."""
    if not placement:
        return {}
    out: dict[str, Any] = {"placement": placement["chosen"]}
    predicted = placement.get("predicted_step_s")
    speculation = placement.get("speculation")
    if predicted and speculation and clipped is not None:
        predicted = expected(speculation["step_s"], speculation["rollback_step_s"], clipped)
    if predicted:
        out["predicted_tokens_per_s"] = round(placement["tokens_per_step"] * nproc / predicted, 1)
        out["step_time_error"] = round(step_s / predicted - 1, 4)
    return out


WARN_ERROR = 0.10  # a step time this far from its prediction is said, not only recorded


def prediction_warning(summary: dict[str, Any], *, refits_profile: bool) -> str | None:
    """One line when the steady steps missed their prediction by more than `WARN_ERROR`,
    naming what the re-fit changed (or that none ran), else None."""
    error = summary.get("step_time_error")
    if error is None or abs(error) <= WARN_ERROR:
        return None
    factors = summary.get("replan", {}).get("factors") or {}
    moved = ", ".join(
        f"{kind} {'floor x' if kind.endswith('_s') else 'rates /'} {f:.3f}"
        for kind, f in sorted(factors.items()) if abs(f - 1) > 0.005
    )  # fmt: skip
    if not moved:
        fix = "no re-fit ran (--no-replan, a run too short, or nothing moved)"
    elif refits_profile:
        fix = f"the re-fit changed {moved}, kept for this host's next runs of this shape"
    else:
        fix = f"the re-fit changed {moved} for this run (--machine auto keeps it for the next)"
    return (
        f"the steps ran {abs(error):.1%} {'slower' if error > 0 else 'faster'} than predicted "
        f"({summary['tokens_per_s']:,.0f} tokens/s against {summary['predicted_tokens_per_s']:,.0f}"
        f" on steps {summary['steady_steps']}); {fix}"
    )


def phase_summary(phases: Phases) -> dict[str, Any]:
    """`startup`: seconds per phase from the command to the first step's end, and their sum;
    `shutdown`: the same from the first step's end to here (the steps included, apart)."""
    startup, shutdown = phases.table(STARTUP), phases.table(SHUTDOWN)
    # sums of the unrounded seconds, so the two differ by the first step's own seconds
    before_first = sum(phases.seconds.get(n, 0.0) for n in STARTUP if n != "first step")
    startup["to_first_step_s"] = round(before_first, 3)
    startup["to_first_step_end_s"] = round(before_first + phases.seconds.get("first step", 0), 3)
    startup.update({f"{k}_s (background)": round(v, 3) for k, v in phases.overlapped.items()})
    return {"startup": startup, "shutdown": shutdown}
