"""Bytes per element of the dtypes the planner reasons about.

Names are short strings ("bf16"), not torch dtypes: slide_ir imports no torch. The table is
read-only so no caller can change what a byte costs for everyone else.
"""

from collections.abc import Mapping
from types import MappingProxyType

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"fp32": 4, "bf16": 2, "fp16": 2})


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of `dtype`; a clear ValueError (listing the valid names) otherwise."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        valid = ", ".join(DTYPE_BYTES)
        raise ValueError(f"dtype must be one of {valid}; got {dtype!r}") from None
