"""`slide train --tensorboard DIR`: each step's metrics as TensorBoard scalars, beside the
metrics JSONL.

Every number of a step's metrics line is one scalar, tagged `train/<field>` (loss, lr,
step_time_s, tokens_per_s, model_tflops, a gradient norm where the run reports one), at the
optimizer step; an eval's (`--eval-data`, `--eval-fraction`) are tagged `eval/<field>`
(`eval/loss`, `eval/tokens`, `eval/s`); nested figures and the config are left to the JSONL. The writer is
`torch.utils.tensorboard.SummaryWriter`, which needs the `tensorboard` package: an optional
extra (`pip install 'slide[tensorboard]'`), checked before the run starts. A resumed run purges
the events a crash left past its checkpoint's step, as the metrics file drops such lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slide.errors import UserError

SKIPPED = {"step", "config"}  # fields of a metrics line that are no scalar of a step


def summary_writer_class() -> type:
    """SummaryWriter, or one line that says how to install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ModuleNotFoundError:  # torch.utils.tensorboard imports tensorboard
        raise UserError("--tensorboard needs the tensorboard package, which is not installed "
                        "here: pip install 'slide[tensorboard]'") from None  # fmt: skip
    return SummaryWriter


class Scalars:
    """A run's TensorBoard event file, one scalar per numeric metric per step."""

    def __init__(self, directory: str, *, resumed_at: int | None = None) -> None:
        purge = None if resumed_at is None else resumed_at + 1
        self.writer = summary_writer_class()(log_dir=directory, purge_step=purge)

    def write(self, step: int, row: Mapping[str, Any], group: str = "train") -> None:
        """`row`'s numbers as `group/<field>` (an eval's `eval_loss` as `eval/loss`)."""
        for key, value in row.items():
            if (
                key not in SKIPPED
                and isinstance(value, int | float)
                and not isinstance(value, bool)
            ):
                self.writer.add_scalar(f"{group}/{key.removeprefix(group + '_')}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
