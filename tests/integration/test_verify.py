"""Shards in megatron-core's eyes: merged shards hold the same sequences and train, and the
pipeline's own index reader agrees with megatron-core's."""

from __future__ import annotations

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset

from pipeline.core.paths import RunPaths
from pipeline.data import datasets
from pipeline.data.indexed import read_index
from pipeline.data.steps import VERIFY
from tests.conftest import SMALL, make_config


def _sequences(prefix) -> list[np.ndarray]:
    ds = IndexedDataset(str(prefix))
    return [np.array(ds[i]) for i in range(len(ds))]


def test_shards_merge_into_one_file_with_the_same_sequences(run_copy):
    paths = RunPaths.of(run_copy.workdir)
    paths.manifest.unlink()
    cfg = make_config(run_copy.workdir, *SMALL, "data.merge_into=1")
    manifest = VERIFY.run(cfg)
    [merged] = manifest["shards"]
    assert len(manifest["tokenized_shards"]) == 2
    expected = _sequences(paths.shard_prefix(0)) + _sequences(paths.shard_prefix(1))
    got = _sequences(paths.root / merged["prefix"])
    assert len(got) == len(expected) and all(
        (a == b).all() for a, b in zip(got, expected, strict=True)
    )
    assert merged["tokens"] == sum(s["tokens"] for s in manifest["tokenized_shards"])
    train, _ = datasets.train_valid_datasets(cfg)
    assert len(train) >= cfg.train.steps * cfg.train.global_batch_size


def test_the_index_reader_agrees_with_megatron_core(tokenized):
    prefix = RunPaths.of(tokenized.workdir).shard_prefix(0)
    ours = read_index(f"{prefix}.idx")
    theirs = IndexedDataset(str(prefix)).index
    assert ours.dtype == theirs.dtype
    assert (ours.sequence_lengths == theirs.sequence_lengths).all()
    assert (ours.sequence_pointers == theirs.sequence_pointers).all()
    assert (ours.document_indices == theirs.document_indices).all()
