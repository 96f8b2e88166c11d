"""The verify step, after the tokenize array: it checks every file of every shard, deduplicates
(data.dedup) and merges (data.merge_into) them if asked, and writes manifest.json: what each
split of each source holds and which files training and evaluation read for it. The step keeps
the name of its first job, as users type it (force=verify, `make status`, the job scripts).

Reads the files with `pipeline.data.indexed`, not megatron-core: this step imports neither it
nor torch, so a tokenize-only run pays no seconds of start-up for them. The dataset index cache
for a training run is built by the train stage's own `index` step (pipeline.data.index_cache).
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TypedDict

import numpy as np

from pipeline.config import PipelineConfig
from pipeline.core import files, log, provenance
from pipeline.core.paths import RunPaths
from pipeline.data import dedup, rejects, shards, sources
from pipeline.data.indexed import CorruptIndex, read_index
from pipeline.data.merge import merge
from pipeline.data.split_assignment import DIGEST_BYTES, SPLITS
from pipeline.data.tokenize import is_shard_complete

_log = log.get()


class CorruptShard(RuntimeError):
    pass


def check_file(prefix: Path, record: dict, vocab_size: int) -> None:
    """Magic, counts, sizes and token ids of one tokenized file against its record and the
    vocabulary."""
    try:
        index = read_index(f"{prefix}.idx")
    except CorruptIndex as e:
        raise CorruptShard(str(e)) from None
    lengths = index.sequence_lengths
    if len(lengths) != record["documents"]:
        raise CorruptShard(f"{prefix}: {len(lengths)} sequences, marker says {record['documents']}")
    tokens = int(lengths.sum(dtype=np.int64))
    if tokens != record["tokens"]:
        raise CorruptShard(f"{prefix}: {tokens} tokens, marker says {record['tokens']}")
    size = os.path.getsize(f"{prefix}.bin")
    if size != tokens * np.dtype(index.dtype).itemsize:
        raise CorruptShard(f"{prefix}.bin: {size} bytes, its index says {tokens} tokens")
    digests = Path(f"{prefix}.digests")
    if digests.exists() and digests.stat().st_size != DIGEST_BYTES * len(lengths):
        raise CorruptShard(
            f"{digests}: {digests.stat().st_size} bytes for {len(lengths)} documents"
        )
    ids = np.memmap(f"{prefix}.bin", dtype=index.dtype, mode="r") if tokens else np.zeros(0)
    if ids.size and int(ids.max()) >= vocab_size:
        raise CorruptShard(f"{prefix}.bin: token id {int(ids.max())} >= vocab size {vocab_size}")


class Manifest(TypedDict):
    """data/manifest.json: the tokenized data a training run reads, and its totals."""

    format: int  # of the data folder (pipeline.data.shards.FORMAT)
    made_from: dict  # the settings and the shards it checked (pipeline.core.provenance)
    fingerprint: str
    tokenizer: str
    tokenizer_sha256: str
    tokenizer_options: dict | None
    tokenizer_trained: bool
    vocab_size: int
    eod_id: int
    split: str
    split_seed: int
    dedup: str
    # by name: what was read, what was removed as duplicates, and each split's files and counts
    sources: dict[str, dict]
    shards: list[dict]  # what each tokenize task read and how long it took
    total: dict


def _checked_shards(paths: RunPaths, cfg: PipelineConfig, made: str, vocab: int) -> list[dict]:
    """Every shard's marker, once its files are checked."""
    markers = []
    for index in range(len(shards.plan(paths, cfg.data))):
        if not is_shard_complete(paths, index, made):
            raise CorruptShard(f"shard {index} in {paths.data_dir} is missing or incomplete: rerun")
        marker = files.read_json(paths.shard_marker(index))
        for by_split in marker["files"].values():
            for record in by_split.values():
                check_file(paths.root / record["prefix"], record, vocab)
        markers.append(marker)
    return markers


def _split_files(markers: list[dict], names: list[str]) -> dict[str, list[dict]]:
    """Split -> its files in corpus order: shard after shard, sources in name order."""
    by_split: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for marker in markers:
        for name in names:
            for split, record in marker["files"].get(name, {}).items():
                entry = {k: record[k] for k in ("prefix", "documents", "tokens")}
                by_split[split].append({"source": name, "shard": marker["shard"], **entry})
    return by_split


def _source_record(name: str, markers: list[dict], removed: dict, read: dict) -> dict:
    counts: Counter = Counter()
    rejected: Counter = Counter()
    for marker in markers:
        own = marker["sources"].get(name)
        if own:
            counts.update({k: own[k] for k in ("documents", "no_token_documents", "tokens")})
            counts.update({"bytes_in": own["bytes_in"], "filtered": own.get("filtered", 0)})
            rejected.update(own["rejected"])
    return {
        **{k: counts[k] for k in ("documents", "no_token_documents", "tokens", "bytes_in")},
        "rejected": dict(rejected),
        "filtered": counts["filtered"],  # Parquet/Arrow rows the source's `where` left out
        "duplicates": {
            "documents": removed["documents"][name],
            "tokens": removed["tokens"][name],
        },
        "split_documents": {s: sum(e["documents"] for e in read[s]) for s in SPLITS},
        "split_tokens": {s: sum(e["tokens"] for e in read[s]) for s in SPLITS},
        # what training and evaluation read: files with at least one token
        "files": {s: [e for e in read[s] if e["tokens"]] for s in SPLITS},
    }


def verify(cfg: PipelineConfig, made_from: dict) -> Manifest:
    """Check every shard's files against its marker and the vocabulary, deduplicate and merge
    if asked, and write data/manifest.json last."""
    paths = RunPaths.of(cfg.workdir)
    started = time.time()
    tok = files.read_json(paths.tokenizer_meta)
    markers = _checked_shards(paths, cfg, made_from["inputs"]["tokenize"], tok["vocab_size"])
    for line in rejects.refuse_rejects(cfg.data, markers, paths):
        _log.warning(line)
    for line in rejects.filtered_out(cfg.data, markers):
        _log.info(line)
    names = [s.name for s in sources.of(cfg.data)]
    by_split = _split_files(markers, names)
    removed: dict[str, Counter] = {"documents": Counter(), "tokens": Counter()}
    if cfg.data.dedup == "exact":
        for split in SPLITS:
            by_split[split], documents, tokens = dedup.deduplicate(paths, by_split[split], split)
            removed["documents"].update(documents)
            removed["tokens"].update(tokens)
    read: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for split, entries in by_split.items():
        for name in names:
            own = [e for e in entries if e["source"] == name]
            groups = cfg.data.merge_into
            read[name][split] = (
                merge(paths, own, groups, split, name) if groups and len(own) > groups else own
            )
    described = {name: _source_record(name, markers, removed, read[name]) for name in names}
    rejected: Counter = Counter()
    for record in described.values():
        rejected.update(record["rejected"])
    manifest: Manifest = {
        "format": shards.FORMAT,
        "made_from": made_from,
        "fingerprint": provenance.fingerprint(made_from),
        "tokenizer": tok["model"],
        "tokenizer_sha256": tok["sha256"],
        "tokenizer_options": tok.get("options"),
        "tokenizer_trained": tok["trained"],
        "vocab_size": tok["vocab_size"],
        "eod_id": tok["eod_id"],
        "split": cfg.data.split,
        "split_seed": cfg.data.split_seed,
        "dedup": cfg.data.dedup,
        "sources": described,
        "shards": [
            {k: m[k] for k in ("shard", "documents", "tokens", "bytes_in", "rejected", "seconds")}
            for m in markers
        ],
        "total": {
            **{
                k: sum(r[k] for r in described.values())
                for k in ("documents", "no_token_documents", "tokens", "bytes_in")
            },
            "rejected": dict(rejected),
            "filtered": sum(r["filtered"] for r in described.values()),
            # records damaged files are predicted to have lost past their one reject each
            rejects.PREDICTED_LOST: sum(
                read.get(rejects.PREDICTED_LOST, 0)
                for m in markers
                for read in m.get("inputs", {}).values()
            ),
            "duplicates": {k: sum(removed[k].values()) for k in ("documents", "tokens")},
            "split_documents": {
                s: sum(r["split_documents"][s] for r in described.values()) for s in SPLITS
            },
            "split_tokens": {
                s: sum(r["split_tokens"][s] for r in described.values()) for s in SPLITS
            },
            "tokenize_seconds": round(sum(m["seconds"] for m in markers), 2),
        },
    }
    manifest["total"]["verify_seconds"] = round(time.time() - started, 2)
    files.write_json(paths.manifest, manifest)  # last: a manifest means the data is ready
    return manifest
