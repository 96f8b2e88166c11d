"""After the tokenize array: check every shard, merge them if asked (pipeline.data.merge),
write manifest.json.

Reads the files with `pipeline.data.indexed`, not megatron-core: this step imports neither it
nor torch, so a tokenize-only run pays no seconds of start-up for them (merging alone uses
megatron-core's builder). The dataset index cache for a training run is built by the train
stage's own `index` step (pipeline.data.index_cache).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import TypedDict

import numpy as np

from pipeline.config import PipelineConfig
from pipeline.core import files, provenance
from pipeline.core.paths import RunPaths
from pipeline.data import shards
from pipeline.data.indexed import CorruptIndex, read_index
from pipeline.data.merge import merge
from pipeline.data.splits import SPLITS, check_splits, split_tokens
from pipeline.data.tokenize import is_shard_complete


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


class Manifest(TypedDict):
    """data/manifest.json: the tokenized data a training run reads, and its totals."""

    made_from: dict  # the split and the shards it checked (pipeline.core.provenance)
    fingerprint: str
    tokenizer: str
    tokenizer_sha256: str
    tokenizer_options: dict | None
    tokenizer_trained: bool
    vocab_size: int
    eod_id: int
    split: str
    shards: list[dict]  # what training reads: the shards, or the files they were merged into
    tokenized_shards: list[dict]
    total: dict


def verify(cfg: PipelineConfig, made_from: dict) -> Manifest:
    """Check every shard against its marker and the vocabulary, merge them if asked, and
    write data/manifest.json last."""
    paths = RunPaths.of(cfg.workdir)
    started = time.time()
    tok = files.read_json(paths.tokenizer_meta)
    checked, totals, rejected = [], Counter(), Counter()
    for index in range(len(shards.plan(paths, cfg.data))):
        prefix = paths.shard_prefix(index)
        if not is_shard_complete(paths, index, made_from["inputs"]["tokenize"]):
            raise CorruptShard(f"shard {index} ({prefix}) is missing or incomplete: rerun tokenize")
        marker = files.read_json(paths.shard_marker(index))
        check_shard(str(prefix), marker, tok["vocab_size"])
        checked.append(
            {
                "prefix": str(prefix.relative_to(paths.root)),  # the run folder can move
                "split_tokens": split_tokens(str(prefix), cfg.data.split),
                **{
                    k: marker[k] for k in ("documents", "tokens", "bytes_in", "rejected", "seconds")
                },
            }
        )
        totals.update({k: marker[k] for k in ("documents", "tokens", "bytes_in")})
        rejected.update(marker["rejected"])
    read = checked
    if cfg.data.merge_into and cfg.data.merge_into < len(checked):
        read = merge(paths, checked, cfg.data.merge_into, cfg.data.split)
    manifest: Manifest = {
        "made_from": made_from,
        "fingerprint": provenance.fingerprint(made_from),
        "tokenizer": tok["model"],
        "tokenizer_sha256": tok["sha256"],
        "tokenizer_options": tok.get("options"),
        "tokenizer_trained": tok["trained"],
        "vocab_size": tok["vocab_size"],
        "eod_id": tok["eod_id"],
        "split": cfg.data.split,
        "shards": read,
        "tokenized_shards": checked,
        "total": {
            **totals,
            "rejected": dict(rejected),
            "split_tokens": {name: sum(s["split_tokens"][name] for s in read) for name in SPLITS},
            "tokenize_seconds": round(sum(s["seconds"] for s in read), 2),
        },
    }
    check_splits(manifest, cfg.model.seq_length)
    manifest["total"]["verify_seconds"] = round(time.time() - started, 2)
    files.write_json(paths.manifest, manifest)  # last: a manifest means the data is ready
    return manifest
