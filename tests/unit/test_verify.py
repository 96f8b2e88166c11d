"""The verify step: damaged shards are refused, shards can be merged into fewer files, and
it reads Megatron's format without importing megatron-core or torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from pipeline import data, verify
from pipeline.indexed import read_index
from pipeline.layout import RunLayout
from tests.conftest import CONF, SMALL, make_config


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


def test_a_truncated_bin_and_an_out_of_vocabulary_id_are_refused(run_copy):
    layout = RunLayout.of(run_copy.workdir)
    prefix = layout.shard_prefix(0)
    marker = json.loads(prefix.with_suffix(".done.json").read_text())
    bin_path = Path(f"{prefix}.bin")
    bin_path.chmod(0o644)
    whole = bin_path.read_bytes()
    bin_path.write_bytes(whole[:-2])
    with pytest.raises(verify.CorruptShard, match="bytes, its index says"):
        verify.check_shard(str(prefix), marker, 512)
    bin_path.write_bytes(whole[:2] + (600).to_bytes(2, "little") + whole[4:])
    with pytest.raises(verify.CorruptShard, match="token id 600 >= vocab size 512"):
        verify.check_shard(str(prefix), marker, 512)


def test_the_index_reader_agrees_with_megatron_core(tokenized):
    prefix = RunLayout.of(tokenized.workdir).shard_prefix(0)
    ours = read_index(f"{prefix}.idx")
    theirs = IndexedDataset(str(prefix)).index
    assert ours.dtype == theirs.dtype
    assert (ours.sequence_lengths == theirs.sequence_lengths).all()
    assert (ours.sequence_pointers == theirs.sequence_pointers).all()
    assert (ours.document_indices == theirs.document_indices).all()


def test_verify_and_tokenize_import_neither_torch_nor_megatron():
    code = (
        "import sys, pipeline.verify, pipeline.tokenize, pipeline.graph\n"
        "loaded = [m for m in ('torch', 'megatron') if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=CONF.parent)
