"""An op's physical work, never seconds: FLOPs, bytes and elements, and the shapes of its GPU
work (`Gemm`, `Attention`) where the planner knows them; the cost model turns it into time.

`Gemm` and `Attention` print compactly (`MxNxK*count`, `BxHxSxDwW`) and parse back.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Gemm:
    """A matmul (m x k) @ (k x n), run `count` times: a GEMM's rate depends on its shape (tile
    and wave quantisation, the K loop's prologue), so the cost model prices each one by it.
    Printed `MxNxK` or `MxNxK*count`."""

    m: int
    n: int
    k: int
    count: int = 1

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Gemm.{name} must be a whole number >= 1, got {value!r}")

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def bytes(self) -> int:
        """BF16 operands read and result written, once per run (the memory-bound limit)."""
        return 2 * (self.m * self.k + self.k * self.n + self.m * self.n) * self.count

    def __str__(self) -> str:
        shape = f"{self.m}x{self.n}x{self.k}"
        return shape if self.count == 1 else f"{shape}*{self.count}"

    @classmethod
    def parse(cls, text: str) -> Gemm:
        shape, _, count = text.partition("*")
        try:
            m, n, k = (int(x) for x in shape.split("x"))
            return cls(m=m, n=n, k=k, count=int(count or 1))
        except ValueError as error:
            raise ValueError(f"bad GEMM {text!r}: expected MxNxK or MxNxK*count") from error


@dataclass(frozen=True, kw_only=True, slots=True)
class Attention:
    """Fused causal attention over `batch` x `heads` sequences of `seq` tokens, `head_dim` wide
    (`window` > 0: a sliding window of that many keys; `masked`: an explicit boolean mask, packed
    documents, which keeps SDPA off its causal kernel): the shape its rate depends on (causal
    block quantisation, occupancy, head width). Printed `BxHxSxD`, `BxHxSxDwW`, a trailing `m`
    when masked."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    window: int = 0
    masked: bool = False

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq", "head_dim", "window"):
            value = getattr(self, name)
            low = 0 if name == "window" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Attention.{name} must be a whole number >= {low}, got {value!r}")

    def __str__(self) -> str:
        shape = f"{self.batch}x{self.heads}x{self.seq}x{self.head_dim}"
        return shape + (f"w{self.window}" if self.window else "") + ("m" if self.masked else "")

    @classmethod
    def parse(cls, text: str) -> Attention:
        masked = text.endswith("m")
        shape, _, window = text.removesuffix("m").partition("w")
        try:
            b, h, s, d = (int(x) for x in shape.split("x"))
            return cls(batch=b, heads=h, seq=s, head_dim=d, window=int(window or 0),
                       masked=masked)  # fmt: skip
        except ValueError as error:
            raise ValueError(f"bad attention shape {text!r}: expected BxHxSxD[wW][m]") from error


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """Physical work of an op, never seconds: the cost model turns it into time. `gemms` and
    `attention` give the shapes of the GPU work where the planner knows them (a decoder layer,
    the fused loss); `flops` stays the model-FLOPs total either way."""

    flops: float = 0.0
    attn_flops: float = 0.0  # the part of `flops` spent in attention (SDPA runs at its own rate)
    bytes: int = 0  # bytes moved (transfers), touched (optimizer) or streamed by GPU kernels
    elements: int = 0  # parameters updated or cast
    gemms: tuple[Gemm, ...] = ()  # the matmuls of `flops - attn_flops`, by shape
    attention: Attention | None = None  # the shape of `attn_flops`

    def __post_init__(self) -> None:
        if min(self.flops, self.attn_flops, self.bytes, self.elements) < 0:
            name = next(
                n for n in ("flops", "attn_flops", "bytes", "elements") if getattr(self, n) < 0
            )
            raise ValueError(f"Work.{name} must be >= 0, got {getattr(self, name)}")
        if self.attn_flops > self.flops:
            raise ValueError(f"Work.attn_flops ({self.attn_flops}) exceeds flops ({self.flops})")
