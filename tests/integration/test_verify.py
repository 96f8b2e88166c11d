"""Shards in megatron-core's eyes: merged files hold the same sequences and train, and the
pipeline's own index reader agrees with megatron-core's."""

from __future__ import annotations

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset

from pipeline.core.paths import RunPaths
from pipeline.data import datasets
from pipeline.data.indexed import read_index
from pipeline.data.split_assignment import SPLITS
from pipeline.data.steps import VERIFY
from tests.conftest import SMALL, make_config


def _sequences(prefix) -> list[np.ndarray]:
    ds = IndexedDataset(str(prefix))
    return [np.array(ds[i]) for i in range(len(ds))]


def test_each_split_merges_into_one_file_with_the_same_sequences(run_copy):
    paths = RunPaths.of(run_copy.workdir)
    paths.manifest.unlink()
    cfg = make_config(run_copy.workdir, *SMALL, "data.merge_into=1")
    manifest = VERIFY.run(cfg)
    for split in SPLITS:
        [merged] = manifest["sources"]["corpus"]["files"][split]
        assert merged["merged_from"] == [
            str(paths.shard_prefix(i, split, "corpus").relative_to(paths.root)) for i in (0, 1)
        ]
        expected = [s for i in (0, 1) for s in _sequences(paths.shard_prefix(i, split, "corpus"))]
        got = _sequences(paths.root / merged["prefix"])
        assert len(got) == len(expected) and all(
            (a == b).all() for a, b in zip(got, expected, strict=True)
        )
        assert merged["tokens"] == manifest["sources"]["corpus"]["split_tokens"][split]
    train = datasets.train_dataset(cfg)
    assert len(train) >= cfg.train.steps * cfg.train.global_batch_size


def test_the_index_reader_agrees_with_megatron_core(tokenized):
    prefix = RunPaths.of(tokenized.workdir).shard_prefix(0, "train", "corpus")
    ours = read_index(f"{prefix}.idx")
    theirs = IndexedDataset(str(prefix)).index
    assert ours.dtype == theirs.dtype
    assert (ours.sequence_lengths == theirs.sequence_lengths).all()
    assert (ours.sequence_pointers == theirs.sequence_pointers).all()
    assert (ours.document_indices == theirs.document_indices).all()
