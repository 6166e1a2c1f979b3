"""JSON as slide writes it (summaries, --json, the metrics JSONL, trace files): strict RFC 8259.

Python's `json` writes inf and nan as `Infinity` and `NaN`, which are not JSON: jq, JavaScript's
`JSON.parse` and most other readers refuse the whole document. A non-finite float is written as
`null` instead (eta with nothing offloaded, where T_d2h + T_update is 0, is the one that occurs;
a diverged loss would be another), and `allow_nan=False` makes anything that slipped past an error
here rather than a file nobody can read.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float inside dicts, lists and tuples replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    return json.dumps(finite(value), allow_nan=False, **kwargs)
