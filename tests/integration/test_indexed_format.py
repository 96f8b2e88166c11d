"""Tokenized shards in Megatron's indexed format: megatron-core reads back exactly what was
encoded, each document in the split its text decides, and each split's bytes equal those of
Megatron-LM's tools/preprocess_data.py run on that split's documents."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

from pipeline.core.paths import RunPaths
from pipeline.data import shards, sources, tokenizer
from pipeline.data.split_assignment import SPLITS, Splitter, digest
from pipeline.data.steps import TOKENIZE, TOKENIZER
from tests.conftest import make_config


def corpus_file(cfg) -> Path:
    return Path(sources.files(RunPaths.of(cfg.workdir), cfg.data)[0][1])


def by_split(lines: list[str], cfg) -> dict[str, list[str]]:
    """The JSONL lines of each split, in order, as data.split and data.split_seed decide."""
    splitter = Splitter(cfg.data.split, cfg.data.split_seed)
    found: dict[str, list[str]] = {split: [] for split in SPLITS}
    for line in lines:
        found[SPLITS[splitter.index(digest(json.loads(line)["text"]))]].append(line)
    return found


def assert_each_split_equals_preprocess_data(cfg, lines: list[str], model: Path, tmp: Path):
    ours = RunPaths.of(cfg.workdir)
    for split, own in by_split(lines, cfg).items():
        jsonl = tmp / f"{split}.jsonl"
        jsonl.write_text("".join(own))
        preprocess_data_reference(jsonl, model, tmp / f"reference-{split}")
        prefix = ours.shard_prefix(0, split, "corpus")
        for ext in (".bin", ".idx"):
            expected = (tmp / f"reference-{split}{ext}").read_bytes()
            assert Path(f"{prefix}{ext}").read_bytes() == expected, (split, ext)


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
    lines = corpus_file(tokenized).read_text().splitlines(keepends=True)
    for split, own in by_split(lines, tokenized).items():
        texts = [json.loads(line)["text"] for line in own]
        read_back = []
        for i in range(shards.planned_count(paths)):
            ds = IndexedDataset(str(paths.shard_prefix(i, split, "corpus")))
            read_back += [np.array(ds[j]) for j in range(len(ds))]  # copies: ds unmaps on release
        assert texts and len(read_back) == len(texts)
        for ids, text in zip(read_back, texts, strict=True):
            assert ids[-1] == sp.eos_id()
            assert sp.decode(ids[:-1].tolist()) == text
            assert ids.dtype == np.uint16  # 512 pieces fit in 16 bits, as Megatron chooses


def test_bytes_equal_megatron_preprocess_data(tokenized, tmp_path):
    lines = corpus_file(tokenized).read_text().splitlines(keepends=True)
    lines = lines[:40] + ['{"text": ""}\n'] + lines[40:80]
    with_empty = tmp_path / "corpus.jsonl"
    with_empty.write_text("".join(lines))
    model = RunPaths.of(tokenized.workdir).tokenizer_model
    cfg = make_config(
        tmp_path / "run",
        f"data.inputs=[{with_empty}]",
        "data.num_shards=1",
        "data.split='60,20,20'",
        f"tokenizer.model={model}",
    )
    tokenize_all(cfg)
    assert_each_split_equals_preprocess_data(cfg, lines, model, tmp_path)


def test_text_that_encodes_to_no_tokens_is_an_empty_document_as_in_preprocess_data(
    tokenized, tmp_path
):
    """With sentencepiece's default (lossy) normalization, whitespace-only text encodes to no
    tokens: preprocess_data.py writes an empty document, not a lone end-of-document token."""
    corpus_text = corpus_file(tokenized).read_text().splitlines(keepends=True)
    lossy = dataclasses.replace(tokenized.tokenizer, lossless=False)
    model = tmp_path / "lossy.model"
    model.write_bytes(
        tokenizer.train_model([json.loads(line)["text"] for line in corpus_text], lossy)
    )
    assert tokenizer.load(model).encode("   ") == []
    lines = corpus_text[:10] + ['{"text": "   "}\n'] + corpus_text[10:20]
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(lines))
    cfg = make_config(
        tmp_path / "run", f"data.inputs=[{jsonl}]", "data.num_shards=1", f"tokenizer.model={model}"
    )
    [marker] = tokenize_all(cfg)
    assert marker["sources"]["corpus"]["no_token_documents"] == 1
    assert_each_split_equals_preprocess_data(cfg, lines, model, tmp_path)
