"""data.merge_into=N: each split of each source concatenated into N files, for filesystems that
prefer few large files to many small ones (the bytes megatron-core's builder would write)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.indexed import concatenate


def merge(paths: RunPaths, entries: list[dict], groups: int, split: str, source: str) -> list[dict]:
    """Concatenate consecutive files of one split of one source into `groups` files, each
    written under a temporary name and renamed when whole."""
    merged = []
    bounds = [round(len(entries) * g / groups) for g in range(groups + 1)]
    for g in range(groups):
        members = entries[bounds[g] : bounds[g + 1]]
        target = paths.merged_prefix(g, split, source)
        partial = Path(f"{target}.partial")
        concatenate([str(paths.root / m["prefix"]) for m in members], str(partial))
        files.publish(partial, target, (".bin", ".idx"))
        merged.append(
            {
                "source": source,
                "prefix": str(target.relative_to(paths.root)),
                "documents": sum(m["documents"] for m in members),
                "tokens": sum(m["tokens"] for m in members),
                "merged_from": [m["prefix"] for m in members],
            }
        )
    return merged
