"""Slurm's time limits: [days-]hours:minutes:seconds, hours:minutes:seconds or minutes."""

from __future__ import annotations


def minutes(limit: str) -> int | None:
    """`limit` as whole minutes (seconds round up); None when it is no Slurm time."""
    days, _, rest = str(limit).rpartition("-")
    try:
        parts = [int(p) for p in rest.split(":")]
        day_count = int(days or 0)
    except ValueError:
        return None
    if len(parts) > 3 or min(parts + [day_count]) < 0:
        return None
    if len(parts) == 1:
        return day_count * 1440 + parts[0]
    hours, whole_minutes, seconds = ([0] * (3 - len(parts))) + parts
    return day_count * 1440 + hours * 60 + whole_minutes + (1 if seconds else 0)
