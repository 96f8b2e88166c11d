"""Megatron's data loader over our shards: disjoint splits, guarded sizes, resumable order."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from pipeline.config import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import datasets, evalsets
from pipeline.data.indexed import ShardWriter
from pipeline.data.splits import SPLITS, split_bounds, split_tokens
from pipeline.data.steps import INDEX
from tests.conftest import SMALL, make_config


def _documents(dataset) -> set[tuple[str, int]]:
    """(shard, document) pairs a blended split draws from."""
    return {
        (ds.dataset_path, int(doc))
        for ds in dataset.datasets
        for doc in np.unique(ds.document_index)
    }


def _test_documents(cfg) -> set[tuple[str, int]]:
    """(shard, document) pairs the evaluation reads as the test split."""
    docs = set()
    manifest = datasets.load_manifest(RunPaths.of(cfg.workdir))
    for ds, first, end in evalsets.test_split(cfg, manifest, 1).windows.parts:
        owner = np.searchsorted(ds.document_indices, np.arange(first, end), side="right") - 1
        docs |= {(ds.path_prefix, int(d)) for d in owner}
    return docs


def test_train_validation_and_test_documents_are_disjoint(tokenized):
    train, valid = datasets.train_valid_datasets(tokenized)
    train_docs, valid_docs = _documents(train), _documents(valid)
    test_docs = _test_documents(tokenized)
    assert train_docs and valid_docs and test_docs
    assert not train_docs & test_docs
    assert not train_docs & valid_docs
    assert not valid_docs & test_docs


def test_datasets_are_sized_for_the_run_and_samples_are_sequences(tokenized):
    train, valid = datasets.train_valid_datasets(tokenized)
    t = tokenized.train
    assert len(train) >= t.steps * t.global_batch_size
    sample = train[0]
    assert sample["tokens"].shape == (tokenized.model.seq_length,)
    assert (sample["tokens"][1:] == sample["labels"][:-1]).all()


def test_a_split_too_small_for_one_sequence_is_refused_quickly(tokenized):
    manifest = datasets.load_manifest(RunPaths.of(tokenized.workdir))
    too_long = manifest["shards"][0]["split_tokens"]["validation"] + 10
    model = dataclasses.replace(tokenized.model, seq_length=too_long)
    cfg = dataclasses.replace(tokenized, model=model)
    started = time.time()
    with pytest.raises(ConfigError, match="data.split: the validation split"):
        datasets.train_valid_datasets(cfg)
    assert time.time() - started < 5


@pytest.mark.parametrize("split", ["90,5,5", "98,1,1", "949,50,1", "1,1,1", "100,0,0", "7,0,3"])
@pytest.mark.parametrize("documents", [1, 7, 95, 1000, 123457])
def test_split_bounds_round_as_megatron_core_does(split, documents):
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    expected = [
        (0, 0) if b is None else (int(round(b[0] * documents)), int(round(b[1] * documents)))
        for b in matrix
    ]
    assert split_bounds(documents, split) == expected


def test_split_tokens_count_what_megatron_core_splits_with_empty_documents(tmp_path):
    """An empty document has no sequence: splits are over documents, not sequences."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    writer = ShardWriter(str(tmp_path / "s.bin"), 512)
    for n in range(40):
        if n % 3 == 0:
            writer.end_document()
        else:
            writer.add_documents([list(range(1, n + 2))], eod=2)
    writer.finalize(str(tmp_path / "s.idx"))
    ds = IndexedDataset(str(tmp_path / "s"))
    counts = split_tokens(str(tmp_path / "s"), "80,10,10")
    docs = ds.document_indices
    bounds = split_bounds(len(docs) - 1, "80,10,10")
    for name, (beg, end) in zip(SPLITS, bounds, strict=True):
        expected = int(ds.sequence_lengths[docs[beg] : docs[end]].sum())
        assert counts[name] == expected, name
    assert sum(counts.values()) == int(ds.sequence_lengths.sum())


def test_the_index_step_builds_the_cache_for_this_config_and_redoes_it_when_it_changes(run_copy):
    assert not INDEX.is_complete(run_copy)
    marker = INDEX.run(run_copy)
    assert INDEX.is_complete(run_copy) and marker["made_from"] == INDEX.made_from(run_copy)
    cache = RunPaths.of(run_copy.workdir).index_cache
    assert list(cache.glob("*-GPTDataset-train-shuffle_index.npy"))
    assert marker["samples"]["train"] >= run_copy.train.steps * run_copy.train.global_batch_size
    longer = make_config(run_copy.workdir, *SMALL, "train.steps=40")
    assert not INDEX.is_complete(longer)
