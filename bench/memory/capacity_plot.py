"""The largest model Slide can fine-tune against host RAM, per mode, beside published points.

For each `--ram-gb` value (GiB of usable RAM, the override `slide capacity` takes) on the paper PC
preset, and each mode (optimizer state in RAM with FP32 or BF16 moments, moments on NVMe, all of it
on NVMe; layer inputs in RAM), the ledger's capacity search (`slide_ir.planning.capacity`) gives
the largest depth-scaled model of llama-3.1 and of qwen2.5; the larger of the two is plotted (each
family scales only up to its largest catalog member). The SlideFormer paper's conclusion figure
(published, not run here) is drawn beside them at the presets' usable RAM: 250 GiB for the 256 GB
PC, 1000 GiB for the 1 TB server. Writes the PNG and a JSON of every plotted value.

    python -m bench.memory.capacity_plot --out bench/data/capacity/capacity_vs_ram.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from slide_ir.planning.capacity import capacity
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import load_machine

FAMILIES = ("llama-3.1", "qwen2.5")
RAM_GIB = (64, 128, 192, 250, 256, 384, 512, 768, 1000, 1024)
# label -> (optimizer placement, moment precision, clipping). Without clipping, as the published
# systems run; the last curve is `slide train`'s default (global clipping holds every
# host-updated gradient in RAM until the step's norm is known).
MODES = {
    "optimizer in RAM, FP32 moments": ("cpu", "fp32", "none"),
    "optimizer in RAM, BF16 moments": ("cpu", "bf16", "none"),
    "moments on NVMe (FP32)": ("nvme-moments", "fp32", "none"),
    "optimizer on NVMe (FP32)": ("nvme", "fp32", "none"),
    "optimizer on NVMe (FP32), --clip global": ("nvme", "fp32", "global"),
}
PUBLISHED_SOURCE = "SlideFormer, DAC'26, conclusion figure"
# (system, usable GiB of the machine it ran on, billions of parameters)
PUBLISHED = (
    ("ZeRO-Offload, 256 GB PC", 250, 8.0),
    ("ColossalAI, 256 GB PC", 250, 32.0),
    ("SlideFormer, 256 GB PC with NVMe (about 90B)", 250, 90.0),
    ("SlideFormer, 1 TB server (over 123B)", 1000, 123.0),
)


def largest_scaled(result: dict[str, Any], families: tuple[str, ...] = FAMILIES) -> dict[str, Any]:
    """The larger depth-scaled answer of `families` in one `capacity` result."""
    name = max(families, key=lambda f: result["families"][f]["scaled_params"])
    fam = result["families"][name]
    return {"params": fam["scaled_params"], "family": name, "scaled_from": fam["scaled_from"],
            "layers": fam["scaled_layers"]}  # fmt: skip


def curve_points(
    machine_name: str,
    nvme: int,
    ram_gib: tuple[float, ...],
    modes: dict[str, tuple[str, str, str]],
) -> list[dict[str, Any]]:
    """One row per (mode, RAM): the largest family-scaled model and the catalog's largest."""
    rows = []
    for label, (optimizer, moments, clip) in modes.items():
        config = TrainConfig(batch=1, seq=1024, activations="cpu", optimizer=optimizer,
                             moments_dtype=moments, clip=clip)  # fmt: skip
        for ram in ram_gib:
            result = capacity(load_machine(machine_name, ram_gb=ram, nvme=nvme), config)
            rows.append({"mode": label, "ram_gib": ram, **largest_scaled(result),
                         "catalog_largest": result["largest_model"],
                         "catalog_largest_params": result["largest_model_params"]})  # fmt: skip
    return rows


def plot(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == label]
        ax.plot([r["ram_gib"] for r in mine], [r["params"] / 1e9 for r in mine], "o-",
                label=f"Slide: {label}")  # fmt: skip
    for (system, ram, params), marker in zip(PUBLISHED, "vs^*", strict=True):
        ax.plot(ram, params, marker, color="black", markersize=10, markerfacecolor="none",
                label=f"published: {system}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([64, 128, 256, 512, 1024], ["64", "128", "256", "512", "1024"])
    ax.set_xlabel("usable host RAM (GiB, --ram-gb)")
    ax.set_ylabel("largest trainable model (B params)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.text(0.01, 0.01, f"published points: {PUBLISHED_SOURCE}", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="PNG to write (JSON beside it)")
    parser.add_argument("--machine", default="paper-pc-4090", help="preset [paper-pc-4090]")
    parser.add_argument("--nvme", type=int, default=2, help="NVMe drives [2]")
    parser.add_argument("--ram-gb", type=float, nargs="+", default=list(RAM_GIB))
    args = parser.parse_args()
    rows = curve_points(args.machine, args.nvme, tuple(args.ram_gb), MODES)
    title = (f"{args.machine}, {args.nvme} NVMe drives, batch 1 x 1024, no clipping "
             f"unless named: the larger of "
             f"{' / '.join(FAMILIES)} depth-scaled")  # fmt: skip
    plot(rows, args.out, title)
    doc = {"machine": args.machine, "nvme": args.nvme, "rows": rows,
           "published": [{"system": s, "ram_gib": r, "params_b": p, "source": PUBLISHED_SOURCE}
                         for s, r, p in PUBLISHED]}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(f"{r['mode']:32s} {r['ram_gib']:6g} GiB {r['params'] / 1e9:7.1f} B "
              f"({r['scaled_from']} to {r['layers']} layers; catalog {r['catalog_largest']})")  # fmt: skip


if __name__ == "__main__":
    main()
