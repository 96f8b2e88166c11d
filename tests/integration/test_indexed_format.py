"""Tokenized shards in Megatron's indexed format: megatron-core reads back exactly what was
encoded, and the bytes equal those of Megatron-LM's tools/preprocess_data.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

from pipeline.core.paths import RunPaths
from pipeline.data import shards, tokenizer
from pipeline.data.steps import TOKENIZE, TOKENIZER
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
    TOKENIZE.prepare(cfg)  # the shard plan (and the built-in corpus), as the launcher does
    TOKENIZER.run(cfg)
    return TOKENIZE.run(cfg)


def test_shards_read_back_through_megatron_equal_the_encoded_documents(tokenized):
    paths = RunPaths.of(tokenized.workdir)
    sp = tokenizer.load(paths.tokenizer_model)
    with open(shards.input_paths(paths, tokenized.data)[0]) as f:
        texts = [json.loads(line)["text"] for line in f]
    read_back = []
    for i in range(shards.planned_count(paths)):
        ds = IndexedDataset(str(paths.shard_prefix(i)))
        read_back += [np.array(ds[j]) for j in range(len(ds))]  # copies: ds unmaps on release
    assert len(read_back) == len(texts)
    for ids, text in zip(read_back, texts, strict=True):
        assert ids[-1] == sp.eos_id()
        assert sp.decode(ids[:-1].tolist()) == text
        assert ids.dtype == np.uint16  # 512 pieces fit in 16 bits, as Megatron chooses


def test_bytes_equal_megatron_preprocess_data(tokenized, tmp_path):
    corpus = Path(shards.input_paths(RunPaths.of(tokenized.workdir), tokenized.data)[0])
    with_empty = tmp_path / "corpus.jsonl"
    lines = corpus.read_text().splitlines(keepends=True)
    with_empty.write_text("".join(lines[:40]) + '{"text": ""}\n' + "".join(lines[40:80]))
    model = RunPaths.of(tokenized.workdir).tokenizer_model
    cfg = make_config(
        tmp_path / "run",
        f"data.inputs=[{with_empty}]",
        "data.num_shards=1",
        f"tokenizer.model={model}",
    )
    tokenize_all(cfg)
    preprocess_data_reference(with_empty, model, tmp_path / "reference")
    ours = RunPaths.of(cfg.workdir).shard_prefix(0)
    for ext in (".bin", ".idx"):
        assert Path(f"{ours}{ext}").read_bytes() == (tmp_path / f"reference{ext}").read_bytes()


def test_text_that_encodes_to_no_tokens_is_an_empty_document_as_in_preprocess_data(
    tokenized, tmp_path
):
    """With sentencepiece's default (lossy) normalization, whitespace-only text encodes to no
    tokens: preprocess_data.py writes an empty document, not a lone end-of-document token."""
    corpus_text = (
        Path(shards.input_paths(RunPaths.of(tokenized.workdir), tokenized.data)[0])
        .read_text()
        .splitlines(keepends=True)
    )
    lossy = dataclasses.replace(tokenized.tokenizer, lossless=False)
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
    ours = RunPaths.of(cfg.workdir).shard_prefix(0)
    for ext in (".bin", ".idx"):
        assert Path(f"{ours}{ext}").read_bytes() == (tmp_path / f"reference{ext}").read_bytes()
