"""A checkpoint's files are hashed per block, so many threads can hash, and verify, one large
file at once; a damaged block anywhere is caught, and saves recorded with one digest per file
(0.3.0 and before) are still verified."""

from __future__ import annotations

import hashlib
import json
import os

from pipeline.training import checkpoint


def _write_files(folder, data: dict[str, bytes]) -> None:
    for name, content in data.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)


def _write_checkpoint(folder, data: dict[str, bytes], complete: dict) -> None:
    _write_files(folder, data)
    sizes = {name: len(content) for name, content in data.items()}
    (folder / "COMPLETE.json").write_text(json.dumps({"step": 1, "files": sizes, **complete}))


def test_block_digests_cover_every_block_and_an_empty_file(tmp_path):
    content = os.urandom(10_000)
    (tmp_path / "big").write_bytes(content)
    (tmp_path / "empty").write_bytes(b"")
    digests = checkpoint.block_digests(tmp_path, ["big", "empty"], block=4096)
    expected = [hashlib.sha256(content[i : i + 4096]).hexdigest() for i in (0, 4096, 8192)]
    assert digests == {"big": expected, "empty": [hashlib.sha256(b"").hexdigest()]}


def test_a_flipped_byte_in_a_late_block_is_found(tmp_path):
    data = {"dist/__0_0.distcp": os.urandom(20_000), "state.json": b"{}"}
    _write_files(tmp_path, data)
    recorded = checkpoint.block_digests(tmp_path, list(data), block=4096)
    _write_checkpoint(tmp_path, data, {"block_bytes": 4096, "sha256_blocks": recorded})
    assert checkpoint.problem(tmp_path) is None

    damaged = bytearray(data["dist/__0_0.distcp"])
    damaged[-3] ^= 0x01
    (tmp_path / "dist/__0_0.distcp").write_bytes(bytes(damaged))
    assert checkpoint.problem(tmp_path) == "dist/__0_0.distcp does not match its sha256 when saved"


def test_a_save_recorded_with_one_digest_per_file_is_still_verified(tmp_path):
    data = {"dist/__0_0.distcp": os.urandom(5000), "state.json": b"{}"}
    whole = {name: hashlib.sha256(content).hexdigest() for name, content in data.items()}
    _write_checkpoint(tmp_path, data, {"sha256": whole})
    assert checkpoint.problem(tmp_path) is None

    (tmp_path / "state.json").write_bytes(b"[]")
    assert checkpoint.problem(tmp_path) == "state.json does not match its sha256 when saved"
