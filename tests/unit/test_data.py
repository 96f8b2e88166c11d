"""Megatron's data loader over our shards: disjoint splits, guarded sizes, resumable order."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipeline import data
from pipeline.config import ConfigError


def _documents(dataset) -> set[tuple[str, int]]:
    """(shard, document) pairs a blended split draws from."""
    return {
        (ds.dataset_path, int(doc))
        for ds in dataset.datasets
        for doc in np.unique(ds.document_index)
    }


def test_train_validation_and_test_documents_are_disjoint(tokenized):
    train, valid = data.train_valid_datasets(tokenized)
    test = data.test_dataset(tokenized)
    train_docs, valid_docs, test_docs = _documents(train), _documents(valid), _documents(test)
    assert train_docs and valid_docs and test_docs
    assert not train_docs & test_docs
    assert not train_docs & valid_docs
    assert not valid_docs & test_docs


def test_datasets_are_sized_for_the_run_and_samples_are_sequences(tokenized):
    train, valid = data.train_valid_datasets(tokenized)
    t = tokenized.train
    assert len(train) >= t.steps * t.global_batch_size
    sample = train[0]
    assert sample["tokens"].shape == (tokenized.model.seq_length,)
    assert (sample["tokens"][1:] == sample["labels"][:-1]).all()


def test_a_split_too_small_for_one_sequence_is_refused_quickly(tokenized):
    manifest = data.load_manifest(tokenized)
    cfg = tokenized.copy()
    cfg.model.seq_length = manifest["shards"][0]["split_tokens"]["validation"] + 10
    started = time.time()
    with pytest.raises(ConfigError, match="data.split: the validation split"):
        data.train_valid_datasets(cfg)
    assert time.time() - started < 5


def test_sampler_resumes_exactly_where_it_stopped():
    whole = list(data.MicroBatchSampler(100, 4, dp_rank=1, dp_size=2))
    resumed = list(data.MicroBatchSampler(100, 4, dp_rank=1, dp_size=2, start=40))
    assert resumed == whole[5:]
    rank0 = list(data.MicroBatchSampler(100, 4, dp_rank=0, dp_size=2))
    assert not {i for b in whole for i in b} & {i for b in rank0 for i in b}
