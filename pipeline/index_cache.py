"""The train stage's first step, a CPU job: build megatron-core's GPTDataset index cache
(document, sample and shuffle indices) for this run's splits, so the GPU job finds it ready
instead of building it while the GPUs wait.

The cache depends on the training config (sequence length, seed, samples per split), so it
belongs to the run, not to the tokenized data: sweep points sharing one data folder each get
their own. The marker records what it was built for; a changed config rebuilds it.
megatron-core writes the cache files in place and trusts any it finds, so a build that was
killed would leave truncated files it later loads: without a marker the folder is cleared
before building.
"""

from __future__ import annotations

import sys
import time

from omegaconf import DictConfig

from pipeline import data, files
from pipeline.layout import RunLayout


def built_for(cfg: DictConfig) -> dict:
    """What the cache depends on: the shards, the split, the sequence length, the seed and the
    number of samples each split needs."""
    sizes = data.Sizes.of(cfg)
    manifest = data.load_manifest(cfg)
    return {
        "shards": [s["prefix"] for s in manifest["shards"]],
        "split": cfg.data.split,
        "seq_length": cfg.model.seq_length,
        "seed": cfg.train.seed,
        "train_samples": sizes.train,
        "validation_samples": sizes.validation,
    }


def is_complete(cfg: DictConfig) -> bool:
    layout = RunLayout.of(cfg.workdir)
    marker = files.read_json_or_none(layout.index_done)
    if marker is None or not layout.manifest.exists():
        return False
    return marker["built_for"] == built_for(cfg)


def run(cfg: DictConfig) -> dict:
    layout = RunLayout.of(cfg.workdir)
    if is_complete(cfg):
        return files.read_json(layout.index_done)
    started = time.time()
    files.remove_tree(layout.index_cache, layout.root)  # no marker: nothing in it is trusted
    manifest = data.load_manifest(cfg)
    train, valid = data.train_valid_datasets(cfg, manifest)
    marker = {
        "built_for": built_for(cfg),
        "samples": {"train": len(train), "validation": len(valid)},
        "seconds": round(time.time() - started, 2),
    }
    files.write_json(layout.index_done, marker)
    print(
        f"index cache: {len(train)} train, {len(valid)} validation samples "
        f"in {marker['seconds']:.1f} s",
        file=sys.stderr,
    )
    return marker
