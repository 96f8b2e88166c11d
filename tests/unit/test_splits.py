"""Each document's split is decided by its text alone: the same held-out documents whatever the
sharding, file order or byte ranges; shares follow data.split; a corpus of skewed files with a
few huge documents and bad records comes back whole; exact duplicates are removed across
sources and shards when asked."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.paths import RunPaths
from pipeline.data import sources
from pipeline.data.dedup import DIGEST, first_copies
from pipeline.data.indexed import read_index
from pipeline.data.split_assignment import SPLITS, Splitter, digest
from pipeline.data.steps import TOKENIZE, TOKENIZER, VERIFY
from tests.conftest import make_config

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "an",
    "be",
    "this",
    "which",
]


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def skewed_corpus(folder: Path) -> dict:
    """Files of very different sizes: one of two huge documents, many small documents, a gzip
    file, bad records here and there. Returns what a reader must find in it."""
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    huge = [prose(rng, 120_000), prose(rng, 90_000)]  # about 0.5 MB each
    (folder / "a-huge.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in huge))
    small = [prose(rng, rng.randint(5, 400)) for _ in range(1500)]
    lines = [json.dumps({"text": t}) + "\n" for t in small[:1000]]
    lines[10] = '{"text": "cut off\n'  # malformed
    lines[500] = '{"title": "no text"}\n'  # missing_text
    (folder / "b-small.jsonl").write_text("".join(lines))
    import gzip

    with gzip.open(folder / "c-more.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in small[1000:])
    (folder / "d-tiny.jsonl").write_text(json.dumps({"text": "One short document."}) + "\n")
    good = huge + small[:10] + small[11:500] + small[501:] + ["One short document."]
    return {"good": good, "rejected": {"malformed_json": 1, "missing_text": 1}}


def tokenize(workdir: Path, *overrides: str) -> dict:
    cfg = make_config(workdir, "stages=[tokenize]", *overrides)
    TOKENIZE.prepare(cfg)
    TOKENIZER.run(cfg)
    TOKENIZE.run(cfg)
    return VERIFY.run(cfg)


def stream(workdir: Path, manifest: dict, split: str, source: str = "corpus") -> np.ndarray:
    """The tokens of one split of one source, its files in order, as evaluation reads them."""
    parts = []
    for f in manifest["sources"][source]["files"][split]:
        index = read_index(f"{workdir / f['prefix']}.idx")
        parts.append(np.fromfile(f"{workdir / f['prefix']}.bin", dtype=index.dtype))
    return np.concatenate(parts) if parts else np.zeros(0)


def test_shares_follow_data_split_and_depend_on_the_text_and_seed_alone():
    digests = [hashlib.blake2b(str(i).encode(), digest_size=16).digest() for i in range(20000)]
    splitter = Splitter("90,5,5", 1234)
    counts = np.bincount([splitter.index(d) for d in digests], minlength=3)
    expected = np.array([0.9, 0.05, 0.05]) * len(digests)
    assert (abs(counts - expected) < 5 * np.sqrt(expected)).all(), counts  # five sigma
    assert [Splitter("90,5,5", 1234).index(d) for d in digests[:500]] == [
        splitter.index(d) for d in digests[:500]
    ]
    reseeded = Splitter("90,5,5", 99)
    assert any(reseeded.index(d) != splitter.index(d) for d in digests[:500])
    assert {Splitter("100,0,0", 1).index(d) for d in digests} == {0}
    assert 1 not in {Splitter("9,0,1", 1).index(d) for d in digests}
    assert digest("a b") != digest("a  b") and digest("x") == digest("x")


def test_the_held_out_documents_are_the_same_for_1_3_and_7_shards(tmp_path, tokenizer_model):
    expected = skewed_corpus(tmp_path / "corpus")
    runs = {}
    for num_shards in (1, 3, 7):
        workdir = tmp_path / f"shards-{num_shards}"
        runs[num_shards] = (
            workdir,
            tokenize(
                workdir,
                f"data.inputs=[{tmp_path}/corpus/*]",
                f"data.num_shards={num_shards}",
                f"tokenizer.model={tokenizer_model}",
            ),
        )
    first_dir, first = runs[1]
    assert len(first["shards"]) == 1 and len(runs[7][1]["shards"]) == 7
    for workdir, manifest in runs.values():
        total = manifest["total"]
        assert total["documents"] + total["no_token_documents"] == len(expected["good"])
        assert total["rejected"] == expected["rejected"]
        assert total["split_tokens"] == first["total"]["split_tokens"]
        assert total["split_documents"] == first["total"]["split_documents"]
        for split in SPLITS:  # the same tokens, in the same order
            assert (stream(workdir, manifest, split) == stream(first_dir, first, split)).all()
    assert all(first["total"]["split_documents"][s] for s in SPLITS)


def test_a_tokenize_run_is_never_refused_for_a_small_split(tmp_path, tokenizer_model):
    corpus = tmp_path / "few.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Document {i}."}) + "\n" for i in range(5)))
    manifest = tokenize(
        tmp_path / "run",
        f"data.inputs=[{corpus}]",
        "data.num_shards=3",
        f"tokenizer.model={tokenizer_model}",
    )
    assert manifest["total"]["documents"] == 5  # whatever each split got


def test_exact_duplicates_are_removed_across_sources_and_shards(tmp_path, tokenizer_model):
    rng = random.Random(3)
    texts = [prose(rng, rng.randint(20, 200)) for _ in range(600)]
    web = texts[:400] + texts[:50]  # 50 repeated within web, later in the file
    code = texts[350:600]  # 50 that web holds already
    (tmp_path / "web.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in web))
    (tmp_path / "code.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in code))
    overrides = [
        f"+data.sources.web.inputs=[{tmp_path}/web.jsonl]",
        f"+data.sources.code={{inputs:[{tmp_path}/code.jsonl],text_key:body,weight:0.5}}",
        "data.num_shards=4",
        f"tokenizer.model={tokenizer_model}",
    ]
    kept = tokenize(tmp_path / "kept", *overrides)
    assert kept["total"]["duplicates"] == {"documents": 0, "tokens": 0}
    deduped = tokenize(tmp_path / "deduped", *overrides, "data.dedup=exact")
    # sources in name order: code comes first, so web loses its copies of code's documents
    assert deduped["sources"]["code"]["duplicates"]["documents"] == 0
    assert deduped["sources"]["web"]["duplicates"]["documents"] == 100
    removed = deduped["total"]["duplicates"]
    assert deduped["total"]["tokens"] == kept["total"]["tokens"]  # what was read, before removal
    read = sum(deduped["total"]["split_tokens"].values())
    assert read == kept["total"]["tokens"] - removed["tokens"]
    root = tmp_path / "deduped"
    seen: list[bytes] = []
    for split in SPLITS:
        for name in ("code", "web"):
            for f in deduped["sources"][name]["files"][split]:
                if f["prefix"].split("/")[-1].startswith("dedup-"):
                    assert (
                        read_index(f"{root / f['prefix']}.idx").sequence_lengths.size
                        == (f["documents"])
                    )
                    original = root / f["deduplicated_from"]
                    digests = np.fromfile(f"{original}.digests", dtype=DIGEST)
                    keep = first_copies([digests])[0]  # within the file, first copies only
                    assert f["documents"] <= int(keep.sum())
                else:
                    digests = np.fromfile(f"{root / f['prefix']}.digests", dtype=DIGEST)
                    seen += [bytes(d) for d in digests]
    assert len(seen) == len(set(seen))
    assert deduped["total"]["split_documents"] == {
        s: sum(deduped["sources"][n]["split_documents"][s] for n in ("code", "web")) for s in SPLITS
    }
    assert sum(deduped["total"]["split_documents"].values()) == 600


def test_a_file_that_two_sources_name_is_refused(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(Exception, match=r"a.jsonl is in data.sources.web too"):
        make_config(
            tmp_path / "run",
            f"+data.sources.web.inputs=[{tmp_path}/*.jsonl]",
            f"+data.sources.copy={{inputs:[{tmp_path}/a.jsonl]}}",
        )


@pytest.fixture(scope="module")
def tokenizer_model(tokenized) -> str:
    return str(RunPaths.of(tokenized.workdir).tokenizer_model)


def test_sources_are_taken_in_name_order_and_files_in_path_order(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.jsonl"):
        (tmp_path / name).write_text('{"text": "x"}\n')
    cfg = make_config(
        tmp_path / "run",
        f"+data.sources.zeta.inputs=[{tmp_path}/c.jsonl]",
        f"+data.sources.alpha={{inputs:[{tmp_path}/b.jsonl,{tmp_path}/a.jsonl]}}",
    )
    listed = sources.files(RunPaths.of(cfg.workdir), cfg.data)
    assert [(n, Path(p).name) for n, p in listed] == [
        ("alpha", "a.jsonl"),
        ("alpha", "b.jsonl"),
        ("zeta", "c.jsonl"),
    ]
