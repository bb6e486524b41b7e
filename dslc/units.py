"""Units, in one place: the plan language's unit table (resolved to SI: bytes, bytes/s,
seconds, FLOP/s), bytes per element of each precision, and how numbers are written back
for a person; the divisors of a whole number."""

from __future__ import annotations

import math

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
GB = 10**9

_SIZE = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}
_BITS = {"b": 1 / 8, "Kb": 1e3 / 8, "Mb": 1e6 / 8, "Gb": 1e9 / 8, "Tb": 1e12 / 8}
UNITS: dict[str, dict[str, float]] = {
    "size": dict(_SIZE),
    "rate": {f"{u}/s": v for u, v in (_SIZE | _BITS).items()},
    "time": {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0},
    "flops": {"FLOP/s": 1.0, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15},
}


def resolve(text: str) -> float:
    """A quantity as a plan writes it, in SI: ``resolve("1 MiB") == 2**20``."""
    number, unit = text.split()
    scale = next(table[unit] for table in UNITS.values() if unit in table)
    return float(number) * scale


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` ≥ 1, ascending, in O(√n) steps (a mesh axis's degrees; the
    search's and the verifier's sub-meshes)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


# bytes per element of each training precision
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def size(n: float) -> str:
    """Binary units: 512 B, 3.00 KiB, 1.50 GiB."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def gib(n: float) -> str:
    """One decimal of GiB, for messages: 81.3 GiB."""
    return f"{n / GiB:.1f} GiB"


def seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} µs" if t > 0 else "0"


def si(x: float, unit: str) -> str:
    """989 TFLOP/s, 15.2 PFLOP."""
    for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def count(n: float) -> str:
    """8.03 B, 124.44 M."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def quantity(value: float, dim: str) -> str:
    """A resolved quantity in the unit a plan would write it in: 450 GB/s, 2 us, 80 GiB."""
    if dim == "rate":
        return f"{value / 1e9:g} GB/s"
    if dim == "time":
        return f"{value * 1e6:g} us"
    if dim == "size":
        return f"{value / GiB:g} GiB"
    return f"{value / 1e12:g} TFLOP/s"
