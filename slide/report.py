"""Plans as text and as JSON: the ledger per tier with its breakdown, and the verdict."""

from __future__ import annotations

import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from slide_ir.ir.drives import drive_contents, drive_paths
from slide_ir.ir.graph import PoolRole
from slide_ir.planning.advice import suggest_fixes
from slide_ir.planning.ledger import REPORT_TIERS, Ledger, build_ledger
from slide_ir.planning.placement_choice import PlacementChoice
from slide_ir.planning.planner import Plan, steady_step_s
from slide_ir.specs.hardware_parts import GIB


def plan_summary(p: Plan) -> dict[str, Any]:
    """The `--json` form: stable keys other tools read."""
    led = p.ledger
    memory: dict[str, Any] = {}
    for tier in REPORT_TIERS:
        memory[tier] = {
            "peak_bytes": led.peak_bytes(tier),
            "capacity_bytes": led.capacity_bytes(tier),
            "bytes_per_param": round(led.peak_bytes(tier) / p.model.total_params, 3),
            "breakdown": led.breakdown(tier),
        }
    memory["cpu"]["pinned_bytes"] = led.pinned_bytes()
    return {
        "model": {
            "name": p.model.name,
            "params": p.model.total_params,
            "layers": p.model.num_layers,
        },
        "machine": p.machine.name,
        "config": asdict(p.config),
        "memory": memory,
        "feasible": led.feasible,
        "overflows": {tier: over for tier, over in led.overflows()},
        "suggestions": advice(p) if not led.feasible else [],
        "resident_units": list(led.resident),
        "streamed_units": list(led.streamed),
        "kept_tapes": p.config.kept_tapes,
        "placement": p.choice.summary(p.model) if p.choice else None,
        "baselines": baselines(p),
        "graph": {
            "ops": len(p.graph.ops),
            "ops_per_lane": p.graph.ops_per_lane(),
            "pools": len(p.graph.pools),
        },
    }


def advice(p: Plan) -> list[str]:
    """`suggest_fixes` for an infeasible plan. Its trial ledgers hold no streamed units, and
    its trial configs move state to NVMe, which a config with streamed units refuses: they get
    the plan's config without its streamed count."""
    return suggest_fixes(p.model, p.machine, replace(p.config, streamed=0), p.ledger)


def baselines(p: Plan) -> dict[str, dict[str, int]]:
    """GPU and host bytes of the other schedules for the same model, machine and batch (with
    per-unit clipping where the plan clips globally: only the sliding schedule defers updates)."""
    out = {}
    clip = "per-unit" if p.config.deferred_updates else p.config.clip
    for schedule in ("gpu-only", "zero-offload"):
        if schedule != p.config.schedule:
            config = replace(p.config, schedule=schedule, resident=0, streamed=0, clip=clip)
            led = build_ledger(p.model, p.machine, config)
            out[schedule] = {tier: led.peak_bytes(tier) for tier in ("gpu", "cpu")}
    return out


HOW = {
    "small": "--placement small: the smallest footprint",
    "pinned": "as given: nothing left to choose",
    "nothing fits": "no placement fits: the smallest footprint is shown",
}


def render_placement(p: Plan) -> list[str]:
    """What the placement search chose and why: its predicted step, the runner-up's and that
    of the rule before the search (no resident units, streamed ones by the closed-form estimate)."""
    choice = p.choice
    if choice is None or choice.how == "schedule":
        return []
    head = f"placement: {choice.chosen.describe(p.model)}"
    if choice.how != "searched":
        lines = [f"{head} ({HOW[choice.how]})"]
        if p.feasible:  # no search timed it: its own graph
            step, s = steady_step_s(p, 1), p.speculation
            mix = (
                f"; expected with {s.rollback_share:.0%} of steps rolled back"
                if s and s.units
                else ""
            )
            lines.append(f"  {step:.3f} s/step predicted "
                         f"({p.config.tokens_per_step / step:,.0f} tokens/s{mix})")  # fmt: skip
        return lines
    step = choice.predicted_step_s or 0.0
    tokens = p.config.tokens_per_step / step if step else 0.0
    lines = [
        head,
        f"  the fastest of {len(choice.considered)} placements that fit: {step:.3f} s/step "
        f"predicted ({tokens:,.0f} tokens/s)",
    ]
    lines += _alternatives(p, choice, step)
    if p.speculation is not None:  # the candidates' steps are not the plan's: say why
        k = choice.timed_speculated
        timed = ("every update waiting for the norm" if not k
                 else "every host update speculating" if k >= p.model.num_layers + 2
                 else f"the first {k} host updates speculating")  # fmt: skip
        lines.append(f"  (candidates timed with {timed}; the plan's own count and steps: "
                     f"global clipping, below)")  # fmt: skip
    return lines


def _alternatives(p: Plan, choice: PlacementChoice, step: float) -> list[str]:
    out = []
    runner, chosen = choice.runner_up, choice.candidate(choice.chosen)
    if runner is not None and chosen is not None:
        tie = ""
        if runner.rank()[0] == chosen.rank()[0]:
            smaller = runner.gpu_bytes > chosen.gpu_bytes
            tie = " (as fast: the smaller GPU footprint won)" if smaller else " (as fast)"
        out.append(
            f"  runner-up: {runner.placement.describe(p.model)}: {runner.step_s:.3f} s/step "
            f"(+{runner.step_s / step - 1:.1%}){tie}"
        )
    legacy = choice.candidate(choice.legacy)
    if legacy is not None and legacy.placement != choice.chosen:
        out.append(
            f"  without resident units (the default before): "
            f"{legacy.placement.describe(p.model)}: {legacy.step_s:.3f} s/step "
            f"(+{legacy.step_s / step - 1:.1%})"
        )
    return out


def _drive_lines(p: Plan, nvme_dirs: tuple[str, ...]) -> list[str]:
    """Each drive's file and what it will hold, and the path the bytes take."""
    drives = p.machine.nvme
    where = nvme_dirs or Path(tempfile.gettempdir()) / "<a new directory>"
    lines = [
        f"      {path!s:48s} {held.bytes / GIB:8.2f} GiB (optimizer state "
        f"{held.state_bytes / GIB:.2f}, "
        + (f"held gradients {held.grad_bytes / GIB:.2f}, " if held.grad_bytes else "")
        + f"layer inputs {held.act_bytes / GIB:.2f}) on {drive.name}"
        for path, held, drive in zip(
            drive_paths(where, len(drives)),
            drive_contents(p.graph, len(drives)),
            drives,
            strict=True,
        )
    ]
    gds = [d.name for d in drives if d.gds]
    lines.append(
        "      I/O: O_DIRECT between each file and pinned host buffers (kvikio's POSIX path on "
        "CUDA where kvikio imports); no GPUDirect Storage"
        + (f": {', '.join(gds)} has it, the executor does not use it yet" if gds else "")
    )
    return lines


def _upload_source(led: Ledger) -> str:
    """Where the sliding units' uploads read their weights (`--host-weights`)."""
    roles = {t.pool.role for t in led.terms}
    cast = "cast from the fp32 master (weight ring)" if PoolRole.WEIGHT_STAGING in roles else ""
    if PoolRole.MASTER_STAGING in roles:
        cast = "cast from the fp32 master read from NVMe (weight ring)"
    pinned = "from a pinned bf16 copy" if PoolRole.HOST_WEIGHTS in roles else ""
    return " or ".join(w for w in (cast, pinned) if w) or "none (nothing slides)"


def speculation_lines(p: Plan) -> list[str]:
    """Global clipping: how many updates speculate, and what a rolled-back step costs."""
    s = p.speculation
    if s is None:
        return []
    if not s.units:
        return [f"global clipping: every update waits for the norm (speculation does not pay "
                f"with {s.rollback_share:.0%} of steps rolled back); step {s.step_s:.3f} s"]  # fmt: skip
    return [f"global clipping: {s.units} host updates speculate; step {s.step_s:.3f} s, "
            f"{s.rollback_step_s:.3f} s when it rolls back, {s.deferred_step_s:.3f} s with "
            f"every update waiting for the norm"]  # fmt: skip


def render_plan(p: Plan, nvme_dirs: tuple[str, ...] = ()) -> str:
    """The plan as `slide plan` prints it; `nvme_dirs` (its --nvme-dir) names the drive files."""
    c, m, led = p.config, p.model, p.ledger
    optimizer = "gpu" if c.schedule == "gpu-only" else c.optimizer  # (--optimizer: the host's)
    lines = [
        f"{m.name} ({m.total_params / 1e9:.2f} B params, {m.num_layers} layers) on {p.machine.name}",
        f"schedule {c.schedule}: batch {c.batch} x seq {c.seq} x accum {c.grad_accum} "
        f"= {c.tokens_per_step:,} tokens/step; activations on {c.activations}, "
        f"optimizer on {optimizer}"
        + (f", resident units {len(led.resident)}" if led.resident else "")
        + (f", streamed updates {len(led.streamed)}" if led.streamed else "")
        + (f", kept tapes {c.kept_tapes}" if c.kept_tapes else "")
        + (f"; uploads {_upload_source(led)}" if c.schedule == "sliding" else ""),
        *render_placement(p),
        *speculation_lines(p),
        "",
    ]
    for tier in REPORT_TIERS:
        peak, cap = led.peak_bytes(tier), led.capacity_bytes(tier)
        if not peak and not cap:
            continue
        pinned = ""
        if tier == "cpu":
            ram = p.machine.ram_bytes / GIB
            pinned = f" (pinned {led.pinned_bytes() / GIB:.1f} GiB; usable = {ram:.1f} GiB RAM less {c.host_margin:.0%})"
        mark = "ok" if peak <= cap else f"OVER by {(peak - cap) / GIB:.1f} GiB"
        per_param = f"{peak / p.model.total_params:.1f} B/param"
        lines.append(
            f"{tier.upper():5s} {peak / GIB:8.2f} GiB of {cap / GIB:.1f} GiB{pinned}  {mark}  "
            f"({per_param})"
        )
        for label, size in led.breakdown(tier).items():
            lines.append(f"      {label:48s} {size / GIB:8.2f} GiB")
        if tier == "nvme" and peak:
            lines += _drive_lines(p, nvme_dirs)
    lines.append("")
    if led.feasible:
        lines.append("verdict: fits")
    else:
        lines.append(
            f"verdict: does not fit ({overflow_text(led.overflows())}). What would make it fit:"
        )
        lines += [f"  - {s}" for s in advice(p)]
    others = "; ".join(
        f"{name} GPU {b['gpu'] / GIB:.1f} GiB, host {b['cpu'] / GIB:.1f} GiB"
        for name, b in baselines(p).items()
    )
    lines.append(f"for comparison, the same run needs: {others}")
    per_lane = ", ".join(f"{lane} {k}" for lane, k in p.graph.ops_per_lane().items())
    lines.append(f"graph: {len(p.graph.ops)} ops over {c.steps} steps ({per_lane})")
    return "\n".join(lines)


def overflow_text(overflows: list[tuple[str, int]]) -> str:
    """The tiers a plan overflows and by how much (`Ledger.overflows`), as its verdict says."""
    return ", ".join(f"{t} by {b / GIB:.1f} GiB" for t, b in overflows)
