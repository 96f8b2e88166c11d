"""Sharded tokenization: megatron-core reads back exactly what was encoded, bytes match
Megatron-LM's preprocess_data.py, bad records are counted with file:line, reruns resume."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

from pipeline import files, graph, shards, tokenize, tokenizer
from pipeline.layout import RunLayout
from pipeline.records import BadRecord
from tests.conftest import make_config


def preprocess_data_reference(jsonl: Path, model: Path, prefix: Path) -> None:
    """What Megatron-LM's tools/preprocess_data.py writes for --tokenizer-type
    GPTSentencePieceTokenizer --append-eod: one document per line, one sequence per document,
    the eod (sentencepiece's eos) appended to non-empty documents, dtype from the vocab size."""
    sp = tokenizer.load(model)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=DType.optimal_dtype(sp.vocab_size()))
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            doc_ids, lengths = [], []
            ids = sp.encode_as_ids(text)
            if ids:
                doc_ids.append(ids)
                lengths.append(len(ids))
            if doc_ids:
                doc_ids[-1].append(sp.eos_id())
                lengths[-1] += 1
            builder.add_document(torch.IntTensor([t for d in doc_ids for t in d]), lengths)
    builder.finalize(f"{prefix}.idx")


def tokenize_all(cfg) -> list[dict]:
    tokenizer.run(cfg)
    graph.prepare_inputs(cfg)
    return [tokenize.run_task(cfg, i) for i in range(len(shards.plan(cfg)))]


def test_shards_read_back_through_megatron_equal_the_encoded_documents(tokenized):
    layout = RunLayout.of(tokenized.workdir)
    sp = tokenizer.load(tokenizer.model_path(tokenized))
    with open(shards.input_paths(tokenized)[0]) as f:
        texts = [json.loads(line)["text"] for line in f]
    read_back = []
    for i in range(len(shards.plan(tokenized))):
        ds = IndexedDataset(str(layout.shard_prefix(i)))
        read_back += [np.array(ds[j]) for j in range(len(ds))]  # copies: ds unmaps on release
    assert len(read_back) == len(texts)
    for ids, text in zip(read_back, texts, strict=True):
        assert ids[-1] == sp.eos_id()
        assert sp.decode(ids[:-1].tolist()) == text
        assert ids.dtype == np.uint16  # 512 pieces fit in 16 bits, as Megatron chooses


def test_bytes_equal_megatron_preprocess_data(tokenized, tmp_path):
    corpus = Path(shards.input_paths(tokenized)[0])
    with_empty = tmp_path / "corpus.jsonl"
    lines = corpus.read_text().splitlines(keepends=True)
    with_empty.write_text("".join(lines[:40]) + '{"text": ""}\n' + "".join(lines[40:80]))
    model = tokenizer.model_path(tokenized)
    cfg = make_config(
        tmp_path / "run",
        f"data.inputs=[{with_empty}]",
        "data.num_shards=1",
        f"tokenizer.model={model}",
    )
    tokenize_all(cfg)
    preprocess_data_reference(with_empty, model, tmp_path / "reference")
    ours = RunLayout.of(cfg.workdir).shard_prefix(0)
    for ext in (".bin", ".idx"):
        assert Path(f"{ours}{ext}").read_bytes() == (tmp_path / f"reference{ext}").read_bytes()


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
        f"tokenizer.model={tokenizer.model_path(tokenized)}",
    )
    [marker] = tokenize_all(cfg)
    assert marker["rejected"] == reasons
    rejects = [json.loads(line) for line in Path(marker["rejects_file"]).read_text().splitlines()]
    where = {(Path(r["path"]).name, r["line"]): r["reason"] for r in rejects}
    assert where[("mixed.jsonl", 2)] == "malformed_json"
    assert where[("mixed.jsonl", 3)] == "invalid_utf8"
    assert where[("mixed.jsonl", 8)] == "too_large"
    assert where[("mixed.jsonl", 11)] == "blank_line"
    assert any(
        name == "truncated.jsonl.gz" and reason == "truncated_gzip"
        for (name, _), reason in where.items()
    )
    sp = tokenizer.load(tokenizer.model_path(cfg))
    ds = IndexedDataset(str(RunLayout.of(cfg.workdir).shard_prefix(0)))
    texts = [sp.decode(ds[i][:-1].tolist()) for i in range(len(ds))]
    assert texts[:4] == good
    gz_docs = texts[4:]
    assert gz_docs and gz_docs == [f"gz document {i}" for i in range(len(gz_docs))]
    assert marker["documents"] == len(texts)


def test_strict_mode_stops_at_the_first_bad_record(tokenized, tmp_path):
    write_bad_corpus(tmp_path)
    cfg = make_config(
        tmp_path / "run",
        f"data.inputs=[{tmp_path}/mixed.jsonl]",
        "data.num_shards=1",
        "data.strict=true",
        f"tokenizer.model={tokenizer.model_path(tokenized)}",
    )
    with pytest.raises(BadRecord, match=r"mixed.jsonl:2: malformed_json"):
        tokenize_all(cfg)
    assert not Path(f"{RunLayout.of(cfg.workdir).shard_prefix(0)}.bin").exists()


def test_byte_ranges_of_one_file_cover_every_line_once(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"doc {i} " + "y" * (i % 37)}) + "\n" for i in range(500))
    )
    plan = shards.make_plan([(str(path), path.stat().st_size)], 7)
    assert len(plan) == 7
    from pipeline.records import Document, read

    seen = [
        item.text
        for spans in plan
        for span in spans
        for item in read(span, "text", 10**6)
        if isinstance(item, Document)
    ]
    assert seen == [f"doc {i} " + "y" * (i % 37) for i in range(500)]


def test_rerun_skips_complete_shards_and_redoes_incomplete_ones(tokenized):
    layout = RunLayout.of(tokenized.workdir)
    prefix = layout.shard_prefix(1)
    before = {ext: Path(f"{prefix}{ext}").stat().st_mtime_ns for ext in (".bin", ".idx")}
    marker = tokenize.run_task(tokenized, 1)
    assert {ext: Path(f"{prefix}{ext}").stat().st_mtime_ns for ext in before} == before
    tokenize.marker_path(prefix).unlink()  # as if the task died before marking itself complete
    redone = tokenize.run_task(tokenized, 1)
    assert redone["bin_sha256"] == marker["bin_sha256"]
    assert redone["idx_sha256"] == marker["idx_sha256"]
    assert files.read_json(tokenize.marker_path(prefix))["tokens"] == marker["tokens"]


def test_text_that_encodes_to_no_tokens_is_an_empty_document_as_in_preprocess_data(
    tokenized, tmp_path
):
    """With sentencepiece's default (lossy) normalization, whitespace-only text encodes to no
    tokens: preprocess_data.py writes an empty document, not a lone end-of-document token."""
    corpus_text = Path(shards.input_paths(tokenized)[0]).read_text().splitlines(keepends=True)
    lossy = tokenized.tokenizer.copy()
    lossy.lossless = False
    model = tmp_path / "lossy.model"
    model.write_bytes(
        tokenizer.train_model([json.loads(line)["text"] for line in corpus_text], lossy)
    )
    assert tokenizer.load(model).encode("   ") == []
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(corpus_text[:10]) + '{"text": "   "}\n' + "".join(corpus_text[10:20]))
    cfg = make_config(
        tmp_path / "run", f"data.inputs=[{jsonl}]", "data.num_shards=1", f"tokenizer.model={model}"
    )
    [marker] = tokenize_all(cfg)
    assert marker["no_token_documents"] == 1
    preprocess_data_reference(jsonl, model, tmp_path / "reference")
    ours = RunLayout.of(cfg.workdir).shard_prefix(0)
    for ext in (".bin", ".idx"):
        assert Path(f"{ours}{ext}").read_bytes() == (tmp_path / f"reference{ext}").read_bytes()
