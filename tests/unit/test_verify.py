"""The verify step refuses damaged shards, reading Megatron's format without megatron-core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from pipeline.data import verify
from pipeline.data.steps import VERIFY


def test_a_damaged_shard_is_refused(run_copy):
    paths = RunPaths.of(run_copy.workdir)
    paths.manifest.unlink()
    idx = Path(f"{paths.shard_prefix(1, 'train', 'corpus')}.idx")
    idx.chmod(0o644)
    raw = bytearray(idx.read_bytes())
    raw[0:4] = bytes(4)  # overwrite the index magic, as a torn or foreign file would
    idx.write_bytes(bytes(raw))
    with pytest.raises(verify.CorruptShard, match="shard 1 .* incomplete|bad magic"):
        VERIFY.run(run_copy)
    assert not paths.manifest.exists() and not VERIFY.is_complete(run_copy)


def test_a_truncated_bin_and_an_out_of_vocabulary_id_are_refused(run_copy):
    paths = RunPaths.of(run_copy.workdir)
    prefix = paths.shard_prefix(0, "train", "corpus")
    marker = json.loads(paths.shard_marker(0).read_text())["files"]["corpus"]["train"]
    bin_path = Path(f"{prefix}.bin")
    bin_path.chmod(0o644)
    whole = bin_path.read_bytes()
    bin_path.write_bytes(whole[:-2])
    with pytest.raises(verify.CorruptShard, match="bytes, its index says"):
        verify.check_file(prefix, marker, 512)
    bin_path.write_bytes(whole[:2] + (600).to_bytes(2, "little") + whole[4:])
    with pytest.raises(verify.CorruptShard, match="token id 600 >= vocab size 512"):
        verify.check_file(prefix, marker, 512)
