"""After the tokenize array: check every shard, optionally merge them, write manifest.json.

Reads the files with `pipeline.indexed`, not megatron-core: this step imports neither it nor
torch, so a tokenize-only run pays no seconds of start-up for them. The dataset index cache
for a training run is built by the train stage's own `index` step (pipeline.index_cache).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import numpy as np
from omegaconf import DictConfig

from pipeline import files
from pipeline.indexed import CorruptIndex, read_index
from pipeline.layout import RunLayout
from pipeline.shards import plan
from pipeline.tokenize import is_shard_complete, marker_path


class CorruptShard(RuntimeError):
    pass


def check_shard(prefix: str, marker: dict, vocab_size: int) -> None:
    """Magic, counts, sizes and token ids of one shard against its marker and the vocabulary."""
    try:
        index = read_index(f"{prefix}.idx")
    except CorruptIndex as e:
        raise CorruptShard(str(e)) from None
    lengths = index.sequence_lengths
    if len(lengths) != marker["documents"]:
        raise CorruptShard(f"{prefix}: {len(lengths)} sequences, marker says {marker['documents']}")
    tokens = int(lengths.sum(dtype=np.int64))
    if tokens != marker["tokens"]:
        raise CorruptShard(f"{prefix}: {tokens} tokens, marker says {marker['tokens']}")
    size = os.path.getsize(f"{prefix}.bin")
    if size != tokens * np.dtype(index.dtype).itemsize:
        raise CorruptShard(f"{prefix}.bin: {size} bytes, its index says {tokens} tokens")
    ids = np.memmap(f"{prefix}.bin", dtype=index.dtype, mode="r") if tokens else np.zeros(0)
    if ids.size and int(ids.max()) >= vocab_size:
        raise CorruptShard(f"{prefix}.bin: token id {int(ids.max())} >= vocab size {vocab_size}")


def merge(layout: RunLayout, shards: list[dict], groups: int, split: str) -> list[dict]:
    """Concatenate consecutive shards into `groups` files with megatron-core's builder, each
    written under a temporary name and renamed when whole."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    from pipeline import data

    merged = []
    bounds = [round(len(shards) * g / groups) for g in range(groups + 1)]
    for g in range(groups):
        members = shards[bounds[g] : bounds[g + 1]]
        target = layout.data_dir / f"merged-{g:05d}"
        partial = f"{target}.partial"
        first = IndexedDataset(str(layout.root / members[0]["prefix"]), mmap=True)
        builder = IndexedDatasetBuilder(f"{partial}.bin", dtype=first.index.dtype)
        del first
        for member in members:
            builder.add_index(str(layout.root / member["prefix"]))
        builder.finalize(f"{partial}.idx")
        files.publish(partial, target, (".bin", ".idx"))
        rejected: Counter = Counter()
        for member in members:
            rejected.update(member["rejected"])
        merged.append(
            {
                "prefix": str(target.relative_to(layout.root)),
                "split_tokens": data.split_tokens(str(target), split),
                **{
                    k: sum(m[k] for m in members)
                    for k in ("documents", "tokens", "bytes_in", "seconds")
                },
                "rejected": dict(rejected),
                "merged_from": [m["prefix"] for m in members],
            }
        )
    return merged


def is_complete(cfg: DictConfig) -> bool:
    return RunLayout.of(cfg.workdir).manifest.exists()


def run(cfg: DictConfig) -> dict:
    from pipeline import data
    from pipeline.tokenizer import meta_path

    layout = RunLayout.of(cfg.workdir)
    if is_complete(cfg):
        return files.read_json(layout.manifest)
    started = time.time()
    tok = files.read_json(meta_path(cfg))
    shards, totals, rejected = [], Counter(), Counter()
    for index in range(len(plan(cfg))):
        prefix = layout.shard_prefix(index)
        if not is_shard_complete(prefix):
            raise CorruptShard(f"shard {index} ({prefix}) is missing or incomplete: rerun tokenize")
        marker = files.read_json(marker_path(prefix))
        check_shard(str(prefix), marker, tok["vocab_size"])
        shards.append(
            {
                "prefix": str(prefix.relative_to(layout.root)),  # the run folder can move
                "split_tokens": data.split_tokens(str(prefix), cfg.data.split),
                **{
                    k: marker[k] for k in ("documents", "tokens", "bytes_in", "rejected", "seconds")
                },
            }
        )
        totals.update({k: marker[k] for k in ("documents", "tokens", "bytes_in")})
        rejected.update(marker["rejected"])
    per_shard = shards
    if cfg.data.merge_into and cfg.data.merge_into < len(shards):
        shards = merge(layout, shards, cfg.data.merge_into, cfg.data.split)
    manifest = {
        "tokenizer": tok["model"],
        "tokenizer_sha256": tok["sha256"],
        "tokenizer_options": tok.get("options"),
        "tokenizer_trained": tok["trained"],
        "vocab_size": tok["vocab_size"],
        "eod_id": tok["eod_id"],
        "split": cfg.data.split,
        "shards": shards,  # what training reads: the shards, or the files they were merged into
        "tokenized_shards": per_shard,
        "total": {
            **totals,
            "rejected": dict(rejected),
            "split_tokens": {
                name: sum(s["split_tokens"][name] for s in shards) for name in data.SPLITS
            },
            "tokenize_seconds": round(sum(s["seconds"] for s in shards), 2),
        },
    }
    data.check_splits(manifest, cfg)
    manifest["total"]["verify_seconds"] = round(time.time() - started, 2)
    files.write_json(layout.manifest, manifest)  # last: a manifest means the data is ready
    return manifest
