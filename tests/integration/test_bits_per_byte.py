"""Bits per byte divides by the UTF-8 bytes of exactly the text whose tokens were predicted: the
whole test split as sentencepiece decodes it, less the first token (never predicted), and for
an evaluation cut short (eval.max_batches), the text of the tokens read, no more."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.core.paths import RunPaths
from pipeline.data import evalsets
from pipeline.data.datasets import load_manifest
from pipeline.data.token_bytes import TokenBytes
from pipeline.data.tokenizer import load
from pipeline.evaluation.evaluate import bits_per_byte


@pytest.fixture(scope="module")
def split(tokenized):
    manifest = load_manifest(RunPaths.of(tokenized.workdir))
    sp = load(manifest["tokenizer"])
    (test,) = evalsets.test_sets(tokenized, manifest, 1)
    documents = [
        [int(t) for t in ds[i]] for ds, first, end in test.windows.parts for i in range(first, end)
    ]
    return test.windows, documents, sp


def _decoded_bytes(sp, ids: list[int]) -> int:
    return len(sp.decode(ids).encode("utf-8"))


def test_the_whole_split_counts_the_bytes_of_its_documents_text(split):
    windows, documents, sp = split
    counted = TokenBytes(sp)
    assert all(d[-1] == sp.eos_id() for d in documents)  # one sequence per document
    text = sum(_decoded_bytes(sp, d[:-1]) for d in documents)
    assert any(sp.id_to_piece(d[0]).startswith("\u2581") for d in documents)  # dummy prefixes
    unpredicted = _decoded_bytes(sp, documents[0][:1])  # the stream's first token
    assert windows.text_bytes(1, windows.tokens, counted) == text - unpredicted
    assert windows.text_bytes(0, windows.tokens, counted) == text


def test_a_cut_short_evaluation_counts_only_the_text_it_read(split):
    windows, documents, sp = split
    counted = TokenBytes(sp)
    stream = np.concatenate([np.array(d) for d in documents])
    starts = np.cumsum([0] + [len(d) for d in documents])
    # window ends spread over the split, where no byte-fallback piece is split from its kin
    ends = {windows.seq_length * int(k) + 1 for k in np.linspace(1, windows.windows - 1, 12)}
    cuts = [
        end
        for end in sorted(ends)
        if not sp.is_byte(int(stream[end - 1])) and not sp.is_byte(int(stream[end]))
    ]
    assert len(cuts) >= 6 and np.searchsorted(starts, cuts[-1]) > 3  # several documents in
    for end in cuts:
        expected = 0
        for n, document in enumerate(documents):
            a, b = int(starts[n]), int(starts[n + 1])
            if a >= end:
                break
            read = document[: min(b, end) - a]
            expected += _decoded_bytes(sp, [t for t in read if t != sp.eos_id()])
        expected -= _decoded_bytes(sp, documents[0][:1])
        assert windows.text_bytes(1, end, counted) == expected, end


def test_bits_per_byte_is_the_summed_loss_in_bits_over_the_bytes():
    assert bits_per_byte(2.0, 300, 1000) == pytest.approx(2.0 * 300 / (math.log(2) * 1000))
    assert math.isnan(bits_per_byte(2.0, 0, 0))
