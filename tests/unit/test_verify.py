"""The verify step: damaged shards are refused, shards can be merged into fewer files."""

from __future__ import annotations

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from pipeline import data, verify
from pipeline.layout import RunLayout
from tests.conftest import SMALL, make_config


def _sequences(prefix) -> list[np.ndarray]:
    ds = IndexedDataset(str(prefix))
    return [np.array(ds[i]) for i in range(len(ds))]


def test_shards_merge_into_one_file_with_the_same_sequences(run_copy):
    layout = RunLayout.of(run_copy.workdir)
    layout.manifest.unlink()
    cfg = make_config(run_copy.workdir, *SMALL, "data.merge_into=1")
    manifest = verify.run(cfg)
    [merged] = manifest["shards"]
    assert len(manifest["tokenized_shards"]) == 2
    expected = _sequences(layout.shard_prefix(0)) + _sequences(layout.shard_prefix(1))
    got = _sequences(layout.root / merged["prefix"])
    assert len(got) == len(expected) and all(
        (a == b).all() for a, b in zip(got, expected, strict=True)
    )
    assert merged["tokens"] == sum(s["tokens"] for s in manifest["tokenized_shards"])
    train, _ = data.train_valid_datasets(cfg)
    assert len(train) >= cfg.train.steps * cfg.train.global_batch_size


def test_a_damaged_shard_is_refused(run_copy):
    layout = RunLayout.of(run_copy.workdir)
    layout.manifest.unlink()
    idx = layout.shard_prefix(1).with_suffix(".idx")
    idx.chmod(0o644)
    raw = bytearray(idx.read_bytes())
    raw[0:4] = bytes(4)  # overwrite the index magic, as a torn or foreign file would
    idx.write_bytes(bytes(raw))
    with pytest.raises(verify.CorruptShard, match="shard 1 .* incomplete|bad magic"):
        verify.run(run_copy)
    assert not layout.manifest.exists()
