"""Debug switches, read from the environment here and nowhere else.

- `SLIDE_SERIAL=1`: run every op only after the op before it in the graph's list has finished
  (GPU work included): one op at a time, in list order. Results must equal an overlapped run.
- `SLIDE_RANDOM_DELAY_MS=X`: each lane sleeps a random 0..X ms before every op (seeded by
  `SLIDE_DELAY_SEED`, default 0): shakes out missing dependencies (race test).
- `SLIDE_WAIT_TIMEOUT_S=T`: a wait for a dependency longer than T seconds fails the run, naming
  the op and what it waited for (default 600; 0 disables).
- `SLIDE_KERNELS=torch`: use the pure-torch references on CUDA too (default: Triton on CUDA).
- `SLIDE_SAVE_DELAY_MS=X`: sleep X ms before writing each tensor of a checkpoint file (and
  inside each of its text files' writes), so a crash test can kill the process during each
  file's write.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Knobs:
    serial: bool = False
    random_delay_ms: float = 0.0
    delay_seed: int = 0
    wait_timeout_s: float = 600.0
    torch_kernels: bool = False
    save_delay_ms: float = 0.0


def from_env(env: dict[str, str] | None = None) -> Knobs:
    e = os.environ if env is None else env
    return Knobs(
        serial=e.get("SLIDE_SERIAL", "0") not in ("", "0"),
        random_delay_ms=float(e.get("SLIDE_RANDOM_DELAY_MS", "0") or 0),
        delay_seed=int(e.get("SLIDE_DELAY_SEED", "0") or 0),
        wait_timeout_s=float(e.get("SLIDE_WAIT_TIMEOUT_S", "600") or 0),
        torch_kernels=e.get("SLIDE_KERNELS", "") == "torch",
        save_delay_ms=float(e.get("SLIDE_SAVE_DELAY_MS", "0") or 0),
    )
