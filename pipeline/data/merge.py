"""data.merge_into=N: the verified shards concatenated into N files with megatron-core's
builder, for filesystems that prefer few large files to many small ones."""

from __future__ import annotations

from collections import Counter

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.splits import split_tokens


def merge(paths: RunPaths, tokenized: list[dict], groups: int, split: str) -> list[dict]:
    """Concatenate consecutive shards into `groups` files with megatron-core's builder, each
    written under a temporary name and renamed when whole."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    merged = []
    bounds = [round(len(tokenized) * g / groups) for g in range(groups + 1)]
    for g in range(groups):
        members = tokenized[bounds[g] : bounds[g + 1]]
        target = paths.merged_prefix(g)
        partial = f"{target}.partial"
        first = IndexedDataset(str(paths.root / members[0]["prefix"]), mmap=True)
        builder = IndexedDatasetBuilder(f"{partial}.bin", dtype=first.index.dtype)
        del first
        for member in members:
            builder.add_index(str(paths.root / member["prefix"]))
        builder.finalize(f"{partial}.idx")
        files.publish(partial, target, (".bin", ".idx"))
        rejected: Counter = Counter()
        for member in members:
            rejected.update(member["rejected"])
        merged.append(
            {
                "prefix": str(target.relative_to(paths.root)),
                "split_tokens": split_tokens(str(target), split),
                **{
                    k: sum(m[k] for m in members)
                    for k in ("documents", "tokens", "bytes_in", "seconds")
                },
                "rejected": dict(rejected),
                "merged_from": [m["prefix"] for m in members],
            }
        )
    return merged
