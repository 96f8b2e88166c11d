"""data.dedup=exact: a document whose text appeared earlier in the corpus is left out.

Copies of one text share a digest, and so a split (pipeline.data.split_assignment): each split is
deduplicated on its own, over every source and shard in corpus order (shard after shard, and
within a shard the sources in name order, as the shard plan lays them out), keeping the first
copy. A file that loses documents is written again without them beside the shard's own file
(dedup-NNNNN), which stays as it was tokenized. Memory: 16 bytes a document of the split.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.indexed import copy_sequences, read_index
from pipeline.data.split_assignment import DIGEST_BYTES

DIGEST = np.dtype(f"V{DIGEST_BYTES}")


def first_copies(digests: list[np.ndarray]) -> list[np.ndarray]:
    """For each array of digests, whether each is the first of its value over all the arrays
    in the order given."""
    every = np.concatenate(digests) if digests else np.zeros(0, DIGEST)
    _, first = np.unique(every, return_index=True)  # a stable sort: the first occurrence
    keep = np.zeros(len(every), dtype=bool)
    keep[first] = True
    return np.split(keep, np.cumsum([len(d) for d in digests])[:-1])


def deduplicate(
    paths: RunPaths, entries: list[dict], split: str
) -> tuple[list[dict], Counter, Counter]:
    """`entries`: the files of one split in corpus order, each {"source", "shard", "prefix",
    "documents", "tokens"}. Returns the entries to read instead (the rewritten file of each
    that lost documents), and the documents and tokens removed by source."""
    digests = [np.fromfile(paths.root / f"{e['prefix']}.digests", dtype=DIGEST) for e in entries]
    removed_documents: Counter = Counter()
    removed_tokens: Counter = Counter()
    kept_entries = []
    for entry, keep in zip(entries, first_copies(digests), strict=True):
        if keep.all():
            kept_entries.append(entry)
            continue
        source = paths.root / entry["prefix"]
        lengths = read_index(f"{source}.idx").sequence_lengths
        target = paths.dedup_prefix(entry["shard"], split, entry["source"])
        partial = Path(f"{target}.partial")
        copy_sequences(str(source), str(partial), keep)
        files.publish(partial, target, (".bin", ".idx"))
        dropped = int((~keep).sum())
        dropped_tokens = int(lengths[~keep].sum(dtype=np.int64))
        removed_documents[entry["source"]] += dropped
        removed_tokens[entry["source"]] += dropped_tokens
        kept_entries.append(
            {
                **entry,
                "prefix": str(target.relative_to(paths.root)),
                "documents": entry["documents"] - dropped,
                "tokens": entry["tokens"] - dropped_tokens,
                "deduplicated_from": entry["prefix"],
            }
        )
    return kept_entries, removed_documents, removed_tokens
