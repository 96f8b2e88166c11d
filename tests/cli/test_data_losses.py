"""Nothing of the corpus is lost in silence: a file whose name says otherwise than its content
is read by its content, with a warning; a file none of whose records is a document, more bad
records than data.max_reject_fraction, data.strict's first bad record, a corpus with no
document at all and a vocabulary the tokenizer cannot build each stop the run in one line
naming the file or the key to change."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import zstandard

from tests.conftest import cli

TOKENIZE = ["stages=[tokenize]", "data.num_shards=2", "tokenizer.vocab_size=400"]


def texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(3000)
    ]
    return [" ".join(rng.choices(words, k=120)) for _ in range(count)]


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def documents(count: int, seed: int = 0) -> bytes:
    return jsonl([{"text": t} for t in texts(count, seed)])


def tokenize(workdir: Path, inputs: list[Path], *args: str):
    listed = ",".join(str(p) for p in inputs)
    return cli(f"workdir={workdir}", "data=jsonl", f"data.inputs=[{listed}]", *TOKENIZE, *args)


def error_line(result) -> str:
    """The one line a refused run ends with; nothing like a traceback before it."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_files_are_read_by_their_content_whatever_their_names_say(tmp_path):
    plain_named_gz = tmp_path / "plain.jsonl.gz"
    plain_named_gz.write_bytes(documents(200, seed=1))
    gzip_named_plain = tmp_path / "packed.jsonl"
    gzip_named_plain.write_bytes(gzip.compress(documents(150, seed=2)))
    (tmp_path / "good.jsonl").write_bytes(documents(100, seed=3))
    inputs = [plain_named_gz, gzip_named_plain, tmp_path / "good.jsonl"]
    result = tokenize(tmp_path / "run", inputs)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"warning: {plain_named_gz} is plain text, whatever its name says" in result.stderr
    assert (
        f"warning: {gzip_named_plain} is gzip-compressed, whatever its name says" in result.stderr
    )
    total = json.loads((tmp_path / "run" / "data" / "manifest.json").read_text())["total"]
    assert total["documents"] == 450 and total["rejected"] == {}


def test_a_file_without_the_text_field_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "good.jsonl").write_bytes(documents(200))
    other_key = tmp_path / "body.jsonl"
    other_key.write_bytes(jsonl([{"body": t} for t in texts(80, seed=4)]))
    result = tokenize(tmp_path / "run", [tmp_path / "good.jsonl", other_key])
    assert result.returncode == 2
    assert error_line(result) == (
        f"error: data.text_key: the first 80 records of {other_key} have no 'text' field; set "
        "data.text_key to the field its records hold the text in "
        "(data.max_reject_fraction=1 accepts it)"
    )
    assert result.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_more_bad_records_than_max_reject_fraction_stop_the_run_until_accepted(tmp_path):
    corpus = tmp_path / "some-bad.jsonl"
    corpus.write_bytes(documents(97) + b"{not json\n" * 3)  # 3% bad
    result = tokenize(tmp_path / "run", [corpus])
    assert result.returncode == 1
    assert error_line(result).startswith(
        "error: data.max_reject_fraction: 3 of 100 records (3.0%) were rejected "
        "(malformed_json 3), more than 1.0%; each is in "
    )
    accepted = tokenize(tmp_path / "run", [corpus], "data.max_reject_fraction=0.05")
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    total = json.loads((tmp_path / "run" / "data" / "manifest.json").read_text())["total"]
    assert total["documents"] == 97 and total["rejected"] == {"malformed_json": 3}


def test_a_truncated_stream_weighs_what_it_lost_and_says_so(tmp_path):
    """Cut short after about 40% of its 536 documents: one reject standing for the documents
    lost, warned about by the tokenize task, past data.max_reject_fraction until accepted."""
    packed = zstandard.ZstdCompressor().compress(documents(536))
    corpus = tmp_path / "cut.jsonl.zst"
    corpus.write_bytes(packed[: len(packed) * 39 // 100])
    result = tokenize(tmp_path / "run", [corpus])
    assert result.returncode == 1
    said = error_line(result)
    assert said.startswith("error: data.max_reject_fraction: ") and "lost to damaged files" in said
    rejected, read = (
        int(n.replace(",", "")) for n in said.split(": ")[2].split(" records")[0].split(" of ")
    )
    assert read == 536 or abs(read - 536) <= 536 * 0.05, said  # predicted, not counted as 1
    assert rejected > 536 // 2
    warned = [line for line in result.stderr.splitlines() if "truncated_zstd" in line]
    assert warned and warned[0].startswith(f"warning: {corpus}:")
    accepted = tokenize(tmp_path / "run", [corpus], "data.max_reject_fraction=1")
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    assert f"warning: {corpus} is damaged (truncated_zstd 1): ~" in accepted.stderr
    total = json.loads((tmp_path / "run" / "data" / "manifest.json").read_text())["total"]
    assert total["predicted_lost"] > 536 // 2 and total["rejected"] == {"truncated_zstd": 1}


def test_data_strict_stops_at_the_first_bad_record_in_one_line(tmp_path):
    corpus = tmp_path / "strict.jsonl"
    corpus.write_bytes(documents(50) + b"{not json\n" + documents(50, seed=5))
    result = tokenize(tmp_path / "run", [corpus], "data.strict=true")
    assert result.returncode == 1
    assert error_line(result).startswith(f"error: data.strict: {corpus}:51: malformed_json ")


CORPORA_WITHOUT_A_DOCUMENT = {
    "empty": (b"", None),
    "no-text-field": (
        jsonl([{"body": "no text here"}] * 20),
        "data.text_key: no record of the corpus has 'text' (missing_text 20)",
    ),
    "text-a-list": (
        jsonl([{"text": ["a", "list"]}] * 20),
        "data.text_key: 'text' of the corpus's records is not a string (text_not_string 20)",
    ),
    "all-malformed": (
        b"{broken\n" * 20,
        "data.inputs: the corpus holds no valid document (malformed_json 20)",
    ),
}


@pytest.mark.parametrize("name", list(CORPORA_WITHOUT_A_DOCUMENT))
def test_a_corpus_without_a_document_is_refused_in_one_line(name, tmp_path):
    """Refused at launch from its first records (exit 2), or, every loss accepted
    (data.max_reject_fraction=1), by the tokenizer that has nothing to learn from (exit 1)."""
    content, tokenizer_says = CORPORA_WITHOUT_A_DOCUMENT[name]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(content)
    result = tokenize(tmp_path / "run", [corpus])
    assert result.returncode == 2
    if not content:  # known from its size before anything is written, whatever is accepted
        assert error_line(result) == f"error: data.inputs: {corpus} is empty"
        assert not (tmp_path / "run").exists()
        return
    assert error_line(result).startswith("error: data.")
    assert f"the first 20 records of {corpus}" in error_line(result)
    accepting = tokenize(tmp_path / "run", [corpus], "data.max_reject_fraction=1")
    assert accepting.returncode == 1
    assert error_line(accepting).startswith(f"error: {tokenizer_says}")


def with_many_characters() -> bytes:
    """Documents of 26 letters and 200 CJK characters: a tokenizer needs a piece for each."""
    rng = random.Random(7)
    han = [chr(0x4E00 + i) for i in range(200)]
    return jsonl([{"text": t + " " + "".join(rng.choices(han, k=400))} for t in texts(100)])


@pytest.mark.parametrize(
    "vocab_size,corpus,expected",
    [
        (300, with_many_characters, "is smaller than the "),
        (30000, lambda: documents(100), "is more pieces than the tokenizer's sample"),
    ],
    ids=["below-the-characters", "beyond-the-sample"],
)
def test_a_vocabulary_the_tokenizer_cannot_build_names_the_key(
    vocab_size, corpus, expected, tmp_path
):
    """Past the fixed pieces (checked with the config): what the corpus asks for."""
    (tmp_path / "good.jsonl").write_bytes(corpus())
    result = tokenize(
        tmp_path / "run", [tmp_path / "good.jsonl"], f"tokenizer.vocab_size={vocab_size}"
    )
    assert result.returncode == 1
    assert error_line(result).startswith(f"error: tokenizer.vocab_size: {vocab_size} {expected}")
