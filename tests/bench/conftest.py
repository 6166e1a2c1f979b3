"""`bench/` holds scripts, not an installed package: put the repository root on sys.path so that
`import bench.<script>` works under a bare `pytest` as well as `python -m pytest` (which adds the
working directory)."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
