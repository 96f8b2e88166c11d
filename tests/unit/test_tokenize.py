"""Sharded tokenization without torch: bad records are counted with file:line, strict mode stops
at the first, byte ranges cover every line once, reruns resume. (Byte-compatibility with
Megatron-LM is in tests/integration/test_indexed_format.py.)"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data import shards, tokenizer
from pipeline.data.indexed import read_index
from pipeline.data.records import BadRecord, Document, read
from pipeline.data.split_assignment import SPLITS
from pipeline.data.steps import TOKENIZE, TOKENIZER
from tests.conftest import make_config


def tokenize_all(cfg) -> list[dict]:
    TOKENIZE.prepare(cfg)  # the shard plan (and the built-in corpus), as the launcher does
    TOKENIZER.run(cfg)
    return TOKENIZE.run(cfg)


def sequences(prefix: Path) -> list[np.ndarray]:
    """The token ids of each sequence of one indexed dataset, read with the pipeline's reader."""
    index = read_index(f"{prefix}.idx")
    tokens = np.fromfile(f"{prefix}.bin", dtype=index.dtype)
    ends = np.cumsum(index.sequence_lengths)
    return np.split(tokens, ends[:-1]) if len(ends) else []


def shard_texts(paths: RunPaths, shard: int, sp, source: str = "corpus") -> dict[str, list[str]]:
    """The documents of each split of one source in a shard, decoded, in file order."""
    return {
        split: [
            sp.decode(ids[:-1].tolist())
            for ids in sequences(paths.shard_prefix(shard, split, source))
        ]
        for split in SPLITS
    }


def in_order(texts: list[str], order: list[str]) -> bool:
    """`texts` appear in `order` in the same order (a subsequence of it)."""
    positions = [order.index(t) for t in texts]
    return positions == sorted(positions)


def write_bad_corpus(folder: Path) -> tuple[list[Path], list[str], dict[str, int]]:
    plain = folder / "mixed.jsonl"
    rows = [
        b'{"text": "first good document"}\n',
        b'{"text": "unterminated\n',
        b'{"text": "bad \xff\xfe bytes"}\n',
        b'{"other": "no text key"}\n',
        b'{"text": 42}\n',
        b'{"text": ""}\n',
        b"[1, 2, 3]\n",
        b'{"text": "' + b"x" * 5000 + b'"}\n',
        b'\xef\xbb\xbf{"text": "after a byte order mark"}\n',
        b'{"text": "crlf line end"}\r\n',
        b'{"text": "lone \\ud800 surrogate"}\n',
        b"\n",
        b'{"text": "last good document"}\n',
    ]
    plain.write_bytes(b"".join(rows))
    gz = folder / "truncated.jsonl.gz"
    payload = gzip.compress(b"".join(b'{"text": "gz document %d"}\n' % i for i in range(2000)))
    gz.write_bytes(payload[: len(payload) // 2])
    good = ["first good document", "after a byte order mark", "crlf line end", "last good document"]
    reasons = {
        "malformed_json": 1,
        "invalid_utf8": 1,
        "missing_text": 1,
        "text_not_string": 1,
        "empty_text": 1,
        "not_an_object": 1,
        "too_large": 1,
        "blank_line": 1,
        "invalid_unicode": 1,
        "truncated_gzip": 1,
    }
    return [plain, gz], good, reasons


def test_bad_records_are_counted_with_file_and_line(tokenized, tmp_path):
    inputs, good, reasons = write_bad_corpus(tmp_path)
    cfg = make_config(
        tmp_path / "run",
        f"data.inputs=[{tmp_path}/*.jsonl*]",
        "data.num_shards=1",
        "data.max_document_bytes=1000",
        f"tokenizer.model={RunPaths.of(tokenized.workdir).tokenizer_model}",
    )
    [marker] = tokenize_all(cfg)
    assert marker["rejected"] == reasons
    rejects = [json.loads(line) for line in Path(marker["rejects_file"]).read_text().splitlines()]
    where = {(Path(r["path"]).name, r["line"]): r["reason"] for r in rejects}
    assert where[("mixed.jsonl", 2)] == "malformed_json"
    assert where[("mixed.jsonl", 3)] == "invalid_utf8"
    assert where[("mixed.jsonl", 8)] == "too_large"
    assert where[("mixed.jsonl", 11)] == "invalid_unicode"
    assert where[("mixed.jsonl", 12)] == "blank_line"
    assert any(
        name == "truncated.jsonl.gz" and reason == "truncated_gzip"
        for (name, _), reason in where.items()
    )
    sp = tokenizer.load(RunPaths.of(cfg.workdir).tokenizer_model)
    by_split = shard_texts(RunPaths.of(cfg.workdir), 0, sp)
    texts = [t for split in SPLITS for t in by_split[split]]
    gz_docs = [t for t in texts if t.startswith("gz document")]
    expected = good + [f"gz document {i}" for i in range(len(gz_docs))]
    assert gz_docs and sorted(texts) == sorted(expected)  # every good document, once
    assert all(in_order(by_split[split], expected) for split in SPLITS)
    assert all(by_split[split] for split in SPLITS)  # a thousand documents fill every split
    assert marker["documents"] == len(texts)


def test_strict_mode_stops_at_the_first_bad_record(tokenized, tmp_path):
    write_bad_corpus(tmp_path)
    cfg = make_config(
        tmp_path / "run",
        f"data.inputs=[{tmp_path}/mixed.jsonl]",
        "data.num_shards=1",
        "data.strict=true",
        f"tokenizer.model={RunPaths.of(tokenized.workdir).tokenizer_model}",
    )
    with pytest.raises(BadRecord, match=r"mixed.jsonl:2: malformed_json"):
        tokenize_all(cfg)
    assert not list(RunPaths.of(cfg.workdir).data_dir.rglob("*.bin"))  # nor partial ones
    assert not list(RunPaths.of(cfg.workdir).data_dir.rglob("*.partial.*"))


def test_byte_ranges_of_one_file_cover_every_line_once(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"doc {i} " + "y" * (i % 37)}) + "\n" for i in range(500))
    )
    plan = shards.make_plan([("corpus", str(path), path.stat().st_size)], 7)
    assert len(plan) == 7
    seen = [
        item.text
        for spans in plan
        for span in spans
        for item in read(span, "text", 10**6)
        if isinstance(item, Document)
    ]
    assert seen == [f"doc {i} " + "y" * (i % 37) for i in range(500)]


def test_rerun_skips_complete_shards_and_redoes_incomplete_ones(tokenized):
    paths = RunPaths.of(tokenized.workdir)
    written = [paths.shard_prefix(1, split, "corpus") for split in SPLITS]
    outputs = [Path(f"{prefix}{ext}") for prefix in written for ext in (".bin", ".idx")]
    before = [p.stat().st_mtime_ns for p in outputs]
    marker = TOKENIZE.run_task(tokenized, 1)
    assert [p.stat().st_mtime_ns for p in outputs] == before
    paths.shard_marker(1).unlink()  # as if the task died before marking itself complete
    assert not TOKENIZE.is_complete(tokenized)
    redone = TOKENIZE.run_task(tokenized, 1)
    assert redone["files"] == marker["files"]  # the same bytes: sizes and checksums
    assert files.read_json(paths.shard_marker(1))["tokens"] == marker["tokens"]
    assert TOKENIZE.is_complete(tokenized)
