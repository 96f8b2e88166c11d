"""The train stage's first step, a CPU job: check that the data holds what the stages read, then
build megatron-core's GPTDataset index cache (document, sample and shuffle indices) for this
run's training blend, so the GPU job finds it ready instead of building it while the GPUs wait.

The cache depends on the training config (sequence length, seed, samples, source weights), so it
belongs to the run, not to the tokenized data: sweep points sharing one data folder each get
their own. The marker records what it was made from; a changed config rebuilds it.
megatron-core writes the cache files in place and trusts any it finds, so a build that was
killed would leave truncated files it later loads: without a marker the folder is cleared
before building.
"""

from __future__ import annotations

import time
from typing import TypedDict

from pipeline.config import PipelineConfig
from pipeline.core import files, log, provenance
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import datasets, mixture, sources

_log = log.get()


def settings(cfg: PipelineConfig) -> dict:
    """What the cache depends on besides the data (which the verify step's fingerprint stands
    for): the sequence length, the seed, the samples training draws and the sources' weights."""
    return {
        "model.seq_length": cfg.model.seq_length,
        "train.seed": cfg.train.seed,
        "train samples": datasets.train_samples(cfg),
        "data.sources weights": sources.weights(cfg.data),
    }


class IndexRecord(TypedDict):
    """index-cache/DONE.json."""

    made_from: dict  # (pipeline.core.provenance)
    fingerprint: str
    samples: dict[str, int]
    seconds: float


def build(cfg: PipelineConfig, made_from: dict) -> IndexRecord:
    """Build the cache from scratch (a folder without a marker is not trusted)."""
    paths = RunPaths.of(cfg.workdir)
    started = time.time()
    manifest = datasets.load_manifest(paths)
    datasets.check_data(cfg, manifest)
    counted = mixture.train_tokens(manifest)
    for line in mixture.epoch_lines(cfg, counted):
        _log.info(line)
    problem = mixture.too_many_epochs(cfg, (counted, None))  # the count, not the estimate
    if problem:
        raise ConfigError(problem)
    files.remove_tree(paths.index_cache, paths.root)  # no marker: nothing in it is trusted
    train = datasets.train_dataset(cfg, manifest)
    marker: IndexRecord = {
        "made_from": made_from,
        "fingerprint": provenance.fingerprint(made_from),
        "samples": {"train": len(train)},
        "seconds": round(time.time() - started, 2),
    }
    files.write_json(paths.index_done, marker)
    _log.info(f"index cache: {len(train)} train samples in {marker['seconds']:.1f} s")
    return marker
