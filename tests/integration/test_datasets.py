"""Megatron's data loader over our files: splits of their own files, guarded sizes, blends by
source weight, resumable order."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from pipeline.config import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import datasets, evalsets
from pipeline.data.dedup import DIGEST
from pipeline.data.split_assignment import SPLITS
from pipeline.data.steps import INDEX
from tests.conftest import SMALL, make_config


def _digests(cfg, split: str) -> set[bytes]:
    """The text digests of every document of a split."""
    manifest = datasets.load_manifest(RunPaths.of(cfg.workdir))
    root = RunPaths.of(cfg.workdir).root
    found: set[bytes] = set()
    for f in manifest["sources"]["corpus"]["files"][split]:
        found |= {bytes(d) for d in np.fromfile(root / f"{f['prefix']}.digests", dtype=DIGEST)}
    return found


def test_train_validation_and_test_hold_different_documents(tokenized):
    by_split = {split: _digests(tokenized, split) for split in SPLITS}
    assert all(by_split.values())
    assert not by_split["train"] & by_split["validation"]
    assert not by_split["train"] & by_split["test"]
    assert not by_split["validation"] & by_split["test"]
    train = datasets.train_dataset(tokenized)  # GPTDataset draws from the training files alone
    paths = {ds.dataset_path for ds in train.datasets}
    assert paths and all("/data/train/" in p for p in paths)


def test_datasets_are_sized_for_the_run_and_samples_are_sequences(tokenized):
    train = datasets.train_dataset(tokenized)
    t = tokenized.train
    assert len(train) >= t.steps * t.global_batch_size
    sample = train[0]
    assert sample["tokens"].shape == (tokenized.model.seq_length,)
    assert (sample["tokens"][1:] == sample["labels"][:-1]).all()


def test_validation_reads_evenly_spaced_whole_windows_the_same_each_time(tokenized):
    manifest = datasets.load_manifest(RunPaths.of(tokenized.workdir))
    [windows] = evalsets.validation_sets(tokenized, manifest, 1).values()
    s = tokenized.model.seq_length
    whole = (windows.tokens - 1) // s
    assert windows.windows == min(tokenized.train.eval_samples, whole)
    assert windows.starts[0] == 0 and windows.starts[-1] <= (whole - 1) * s
    assert all(windows[k]["loss_mask"].sum() == s for k in range(windows.windows))
    again = evalsets.validation_sets(tokenized, manifest, 1)["corpus"]
    assert all((again[k]["tokens"] == windows[k]["tokens"]).all() for k in range(windows.windows))


def test_a_split_too_small_for_one_sequence_is_refused_quickly(tokenized):
    manifest = datasets.load_manifest(RunPaths.of(tokenized.workdir))
    too_long = manifest["sources"]["corpus"]["split_tokens"]["validation"] + 10
    model = dataclasses.replace(tokenized.model, seq_length=too_long)
    cfg = dataclasses.replace(tokenized, model=model)
    started = time.time()
    with pytest.raises(ConfigError, match="data.split: the validation split has"):
        datasets.check_data(cfg, manifest)
    with pytest.raises(ConfigError, match="data.split: the validation split has"):
        INDEX.run(cfg)
    assert time.time() - started < 5


def test_the_index_step_refuses_a_budget_past_max_epochs_by_the_count(tokenized):
    """The plan refuses on an estimate only far past data.max_epochs; the count decides."""
    manifest = datasets.load_manifest(RunPaths.of(tokenized.workdir))
    tokens = manifest["sources"]["corpus"]["split_tokens"]["train"]
    t = tokenized.train
    epochs = t.steps * t.global_batch_size * tokenized.model.seq_length / tokens
    data = dataclasses.replace(tokenized.data, max_epochs=epochs / 1.2)
    cfg = dataclasses.replace(tokenized, data=data)
    with pytest.raises(ConfigError, match=r"^train.steps: .* more than data.max_epochs="):
        INDEX.run(cfg)
    assert not RunPaths.of(cfg.workdir).index_done.exists()


def test_the_index_step_builds_the_cache_for_this_config_and_redoes_it_when_it_changes(run_copy):
    assert not INDEX.is_complete(run_copy)
    marker = INDEX.run(run_copy)
    assert INDEX.is_complete(run_copy) and marker["made_from"] == INDEX.made_from(run_copy)
    cache = RunPaths.of(run_copy.workdir).index_cache
    assert list(cache.glob("*-GPTDataset-train-shuffle_index.npy"))
    assert marker["samples"]["train"] >= run_copy.train.steps * run_copy.train.global_batch_size
    longer = make_config(run_copy.workdir, *SMALL, "train.steps=40")
    assert not INDEX.is_complete(longer)
