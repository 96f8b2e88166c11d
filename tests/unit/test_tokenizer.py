"""The tokenizer: lossless round trips and reproducible training."""

from __future__ import annotations

import json

from pipeline.core.paths import RunPaths
from pipeline.data import sources, tokenizer
from pipeline.data.steps import TOKENIZER
from tests.conftest import make_config


def corpus_file(cfg) -> str:
    return sources.files(RunPaths.of(cfg.workdir), cfg.data)[0][1]


TRICKY = [
    "a\nb",
    "a b",
    "a   b",
    "a\n\n\nb",
    "\tindented\n    code",
    " leading space",
    "trailing space ",
    "CRLF\r\nline",
    "unicode: naïve café 日本語 😀",
    "digits 1234567890",
    "",
]


def test_round_trip_every_corpus_document_and_whitespace_edge_cases(tokenized):
    sp = tokenizer.load(RunPaths.of(tokenized.workdir).tokenizer_model)
    with open(corpus_file(tokenized)) as f:
        documents = [json.loads(line)["text"] for line in f]
    assert len(documents) > 50
    for text in documents + TRICKY:
        assert sp.decode(sp.encode(text)) == text


def test_whitespace_variants_encode_differently(tokenized):
    sp = tokenizer.load(RunPaths.of(tokenized.workdir).tokenizer_model)
    encoded = {tuple(sp.encode(t)) for t in ("a\nb", "a b", "a   b")}
    assert len(encoded) == 3


def test_same_seed_and_sample_give_the_same_model(tokenized, tmp_path):
    with open(corpus_file(tokenized)) as f:
        texts = [json.loads(line)["text"] for line in f][:200]
    first = tokenizer.train_model(texts, tokenized.tokenizer)
    second = tokenizer.train_model(texts, tokenized.tokenizer)
    assert first == second


def test_existing_model_is_copied_into_the_run(tokenized, tmp_path):
    source = RunPaths.of(tokenized.workdir).tokenizer_model
    cfg = make_config(tmp_path, f"tokenizer.model={source}")
    meta = TOKENIZER.run(cfg)
    assert not meta["trained"] and TOKENIZER.is_complete(cfg)
    assert RunPaths.of(cfg.workdir).tokenizer_model.read_bytes() == source.read_bytes()


def test_reservoir_sample_is_seeded_and_bounded():
    docs = [str(i) for i in range(1000)]
    a = tokenizer.sample_documents(iter(docs), 50, seed=7)
    assert a == tokenizer.sample_documents(iter(docs), 50, seed=7)
    assert a != tokenizer.sample_documents(iter(docs), 50, seed=8)
    assert len(a) == 50 and len(set(a)) == 50
