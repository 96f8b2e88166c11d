"""A long document encoded in pieces gives the ids of the whole text, against sentencepiece on
the whole text, for text built to break a careless cut: runs of spaces and newlines, tabs,
sentencepiece's own space mark, digits, characters only byte fallback encodes."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import TokenizerConfig
from pipeline.core.paths import RunPaths
from pipeline.data import pieces, tokenize
from pipeline.data.pieces import PieceEncoder
from pipeline.data.records import Span
from tests.conftest import ROOT
from tests.unit.test_tokenize import sequences

ALPHABET = [" ", "  ", "   ", "\n", "\n\n", " \n", "\n ", "\t", "\r\n", "\u2581", "\u2581\u2581",
            "a", "the", "def", "x", "1234", "0", "\u00e9", "\u65e5\u672c", "\U0001f642",
            "\u3000", "\u00a0", "(", ")", ".", "  \u2581 ", "ing", "tion"]  # fmt: skip


def adversarial(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(ALPHABET) for _ in range(n))


@pytest.fixture(scope="module")
def models() -> dict:
    import sentencepiece as spm

    from pipeline.data.tokenizer import train_model

    texts = [p.read_text() for p in sorted((ROOT / "pipeline" / "data").glob("*.py"))]
    texts += [adversarial(seed, 3000) for seed in range(5)]
    trained = {}
    for kind in ("bpe", "unigram"):
        tk = TokenizerConfig(type=kind, vocab_size=700, threads=1)
        trained[kind] = spm.SentencePieceProcessor(model_proto=train_model(texts, tk))
    return trained


def test_pieces_of_a_long_document_give_the_ids_of_the_whole_text(models):
    sp = models["bpe"]
    code = "".join(p.read_text() for p in sorted((ROOT / "pipeline" / "config").glob("*.py")))
    one_line = adversarial(7, 4000).replace("\n", " ").replace("\r", "")
    texts = [adversarial(11, 12_000), code[:60_000], one_line, "   \n\n" + adversarial(3, 500)]
    for piece_chars in (5, 64, 1000):
        encoder = PieceEncoder(sp, piece_chars)
        assert encoder.at_newline and encoder.at_space  # the pipeline's tokenizer is cut
        for text in texts:
            assert encoder.encode_long(text).tolist() == sp.encode(text), (piece_chars, text[:40])


def test_a_unigram_model_is_never_cut_and_still_encodes_right(models):
    # its best path sums scores, whose rounding depends on what came before a cut
    sp = models["unigram"]
    encoder = PieceEncoder(sp, 16)
    assert not (encoder.at_newline or encoder.at_space)
    text = adversarial(5, 3000)
    encoded = [np.asarray(ids).tolist() for ids in encoder.encode([text, "short"])]
    assert encoded == [sp.encode(text), sp.encode("short")]


def test_the_tokenize_step_writes_the_whole_text_ids_of_a_long_document(
    tokenized, tmp_path, monkeypatch
):
    from pipeline.data.tokenizer import load

    monkeypatch.setattr(pieces, "PIECE_CHARS", 257)
    sp = load(RunPaths.of(tokenized.workdir).tokenizer_model)
    text = (Path(ROOT) / "README.md").read_text()[:40_000] + adversarial(2, 2000)
    (tmp_path / "book.txt").write_text(text)
    (tmp_path / "short.txt").write_text("a short one")
    data = tokenized.data.__class__(**{**tokenized.data.__dict__, "format": "text"})
    spans = [Span(str(tmp_path / name)) for name in ("book.txt", "short.txt")]
    tokenize.tokenize_spans(data, 2, spans, sp, tmp_path / "out", tmp_path / "rejects.jsonl", "t")
    written = [ids[:-1].tolist() for ids in sequences(tmp_path / "out")]
    assert written == [sp.encode(text), sp.encode("a short one")]
    assert all(ids[-1] == sp.eos_id() for ids in sequences(tmp_path / "out"))
    assert np.asarray(PieceEncoder(sp).encode_long(text)).tolist() == sp.encode(text)
