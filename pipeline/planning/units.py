"""Numbers as the plan prints them: counts (1.3 B), FLOPs, GiB, durations."""

from __future__ import annotations

from pipeline.runtime.gpus import GIB

__all__ = ["GIB", "count", "duration", "flops", "gib"]


def count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}" if n < 100 * size else f"{n / size:,.0f} {unit}"
    return f"{n:.0f}"


def flops(n: float) -> str:
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} FLOP"


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 or n == 0 else f"{n / 2**20:.1f} MiB"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
