"""Inputs as corpora are published: told apart by their bytes whatever their names, Parquet
cut by row groups and zstd by frames, every record read once and counted, damaged files named
in one reject after what could be read, row filters, text files, saved `datasets` folders."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.config import row_filter
from pipeline.config.split_weights import Split
from pipeline.core.errors import ConfigError, StageError
from pipeline.core.paths import RunPaths
from pipeline.data import formats, shards, sources
from pipeline.data.datasets import check_splits
from pipeline.data.records import Document, Filtered, Reject, Span, read
from tests.conftest import make_config


def documents(items) -> list[str]:
    return [item.text for item in items if isinstance(item, Document)]


def read_plan(plan, text_key="text", **kw) -> list:
    return [item for spans in plan for span in spans for item in read(span, text_key, 10**6, **kw)]


def write_parquet(path: Path, texts: list, groups: int, **columns) -> None:
    table = pa.table({"text": texts, **columns})
    pq.write_table(table, path, row_group_size=max(1, -(-len(texts) // groups)))


def write_zstd(path: Path, chunks: list[bytes], truncate_last: int = 0) -> None:
    frames = [zstandard.ZstdCompressor().compress(chunk) for chunk in chunks]
    if truncate_last:
        frames[-1] = frames[-1][:-truncate_last]
    path.write_bytes(b"".join(frames))


def write_saved_dataset(folder: Path, texts: list[str], files: int) -> None:
    """The layout of datasets' save_to_disk: Arrow stream files, dataset_info.json, state.json."""
    folder.mkdir()
    names = [f"data-{i:05d}-of-{files:05d}.arrow" for i in range(files)]
    for i, name in enumerate(names):
        table = pa.table({"text": texts[i::files], "id": list(range(len(texts[i::files])))})
        with (
            pa.OSFile(str(folder / name), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as writer,
        ):
            writer.write_table(table, max_chunksize=7)
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {}}}))
    state = {"_data_files": [{"filename": n} for n in names], "_split": "train"}
    (folder / "state.json").write_text(json.dumps(state))


def test_kinds_are_told_by_content_whatever_the_names(tmp_path):
    texts = ["alpha beta", "gamma delta"]
    jsonl = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    write_parquet(tmp_path / "a.jsonl", texts, 1)
    write_zstd(tmp_path / "b.gz", [jsonl])
    (tmp_path / "c.zst").write_bytes(gzip.compress(jsonl))
    write_saved_dataset(tmp_path / "d", texts, 1)
    (tmp_path / "e.parquet").write_bytes(jsonl)
    arrow = str(tmp_path / "d" / "data-00000-of-00001.arrow")
    cases = {"a.jsonl": "parquet", "b.gz": "zstd", "c.zst": "gzip", "e.parquet": "plain"}
    for name, kind in cases.items():
        path = str(tmp_path / name)
        assert formats.kind(path) == kind
        assert kind in formats.misnamed(path)
        assert documents(read(Span(path), "text", 10**6)) == texts
    assert formats.kind(arrow) == "arrow" and formats.misnamed(arrow) is None
    assert sources.matches(str(tmp_path / "d")) == [arrow]
    assert documents(read(Span(arrow), "text", 10**6)) == texts


def test_parquet_row_groups_spread_over_tasks_and_bad_values_are_counted_by_row(tmp_path):
    texts = [f"document {i}" for i in range(1000)]
    texts[17], texts[503] = None, ""
    path = tmp_path / "web.parquet"
    write_parquet(path, texts, 100, score=[i / 1000 for i in range(1000)])
    size = path.stat().st_size
    plan = shards.make_plan([("web", str(path), size)], 10)
    assert len(plan) == 10 and all(len(spans) == 1 for spans in plan)  # 100 groups, 10 tasks
    groups = [(spans[0].start, spans[0].end) for spans in plan]
    assert groups[0][0] == 0 and groups[-1][1] == 100
    assert all(8 <= end - start <= 12 for start, end in groups)
    items = read_plan(plan)
    assert documents(items) == [t for t in texts if t]
    rejects = {(r.line, r.reason) for r in items if isinstance(r, Reject)}
    assert rejects == {(18, "null_text"), (504, "empty_text")}
    assert next(r for r in items if isinstance(r, Reject)).where() == f"{path} row 18"
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, None, 3]}), numbers)
    found = [(r.line, r.reason, r.detail) for r in read(Span(str(numbers)), "text", 10**6)]
    assert found == [
        (1, "text_not_string", "int64"),
        (2, "null_text", ""),
        (3, "text_not_string", "int64"),
    ]


def test_a_damaged_parquet_file_is_one_reject_after_what_was_read(tmp_path):
    path = tmp_path / "cut.parquet"
    write_parquet(path, [f"row {i}" for i in range(100)], 4)
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])  # the footer is gone: nothing can be read
    [reject] = list(read(Span(str(path)), "text", 10**6))
    assert reject.reason == "damaged_parquet" and reject.path == str(path)
    meta = pq.ParquetFile(pa.BufferReader(whole)).metadata
    third = meta.row_group(2).column(0).data_page_offset
    damaged = bytearray(whole)
    damaged[third : third + 64] = b"\xff" * 64  # the third row group's pages
    path.write_bytes(bytes(damaged))
    items = list(read(Span(str(path)), "text", 10**6))
    kept = documents(items)
    assert kept[:50] == [f"row {i}" for i in range(50)]  # the groups before the damage
    [reject] = [r for r in items if isinstance(r, Reject)]
    assert (reject.line, reject.reason, reject.lost) == (51, "damaged_parquet", 25)  # its group
    assert kept[50:] == [f"row {i}" for i in range(75, 100)]  # and the group after


def test_zstd_frames_are_units_and_a_truncated_frame_keeps_what_came_before(tmp_path):
    lines = [
        json.dumps({"text": f"line {i} " + "z" * (i % 13)}).encode() + b"\n" for i in range(300)
    ]
    stream = b"".join(lines)
    cuts = [0, len(stream) // 3 + 5, 2 * len(stream) // 3 + 7, len(stream)]  # inside lines
    path = tmp_path / "pile.jsonl.zst"
    write_zstd(path, [stream[a:b] for a, b in zip(cuts, cuts[1:], strict=False)], truncate_last=9)
    frames = formats.zstd_frames(str(path))
    assert len(frames) == 3 and frames[-1][1] == path.stat().st_size
    plan = shards.make_plan([("pile", str(path), path.stat().st_size)], 3)
    assert [len(spans) for spans in plan] == [1, 1, 1]
    items = read_plan(plan)
    got = documents(items)
    expected = [json.loads(line)["text"] for line in lines]
    assert got == expected[: len(got)] and len(got) > 200  # each line once, in order
    [reject] = [r for r in items if isinstance(r, Reject)]
    assert reject.reason == "truncated_zstd" and reject.line == len(got) + 1


def test_a_damaged_stream_stands_for_the_records_it_lost(tmp_path):
    """A stream cut short or damaged is one reject weighing what it lost: its zstd frame's
    recorded size, or the bytes after the damage at the ratio of those before; None where
    nothing records it (a gzip or a zstd frame without its size, cut short)."""
    import random

    rng = random.Random(3)
    lines = [
        json.dumps({"text": " ".join(rng.choices(["alpha", "beta", "gamma"], k=rng.randint(9, 60)))})
        .encode() + b"\n"
        for _ in range(3000)
    ]  # fmt: skip
    stream = b"".join(lines)

    def outcome(name: str, content: bytes) -> tuple[int, int | None]:
        (tmp_path / name).write_bytes(content)
        items = list(read(Span(str(tmp_path / name)), "text", 10**6))
        [reject] = [r for r in items if isinstance(r, Reject)]
        assert reject.reason.startswith("truncated_")
        return len(documents(items)), reject.lost

    sized = zstandard.ZstdCompressor().compress(stream)  # the frame records its size
    kept, lost = outcome("cut.jsonl.zst", sized[: len(sized) * 2 // 5])
    assert 200 < kept < 2800 and abs(kept + lost - 3000) <= 90  # a prediction
    flipped = bytearray(sized)
    flipped[len(sized) * 2 // 5 : len(sized) * 2 // 5 + 50] = b"\xff" * 50  # damage inside
    kept, lost = outcome("damaged.jsonl.zst", bytes(flipped))
    assert kept > 200 and abs(kept + lost - 3000) <= 90  # the blocks before it are kept
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(stream)
    assert outcome("unsized.jsonl.zst", unsized[: len(unsized) * 2 // 5])[1] is None
    packed = gzip.compress(stream)
    assert outcome("cut.jsonl.gz", packed[: len(packed) * 2 // 5])[1] is None
    members = [gzip.compress(b"".join(lines[i : i + 1000])) for i in (0, 1000, 2000)]
    broken = bytearray(members[1])
    broken[2] = 9  # no compression method gzip knows: the second member is damaged
    kept, lost = outcome("damaged.jsonl.gz", members[0] + bytes(broken) + members[2])
    assert kept == 1000 and abs(lost - 2000) <= 200


@pytest.fixture(scope="module")
def same_documents(tmp_path_factory) -> tuple[Path, list[str]]:
    """536 documents of the built-in corpus as JSONL, Parquet and zstd."""
    from pipeline.data import corpus

    folder = tmp_path_factory.mktemp("same")
    texts = list(itertools.islice(corpus.documents(), 536))
    jsonl = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    (folder / "corpus.jsonl").write_bytes(jsonl)
    write_parquet(folder / "corpus.parquet", texts, 4)
    write_zstd(folder / "corpus.jsonl.zst", [jsonl[: len(jsonl) // 2], jsonl[len(jsonl) // 2 :]])
    return folder, texts


@pytest.mark.parametrize("tokenizer_at_hand", [True, False], ids=["tokenizer", "vocab-size"])
def test_epochs_are_estimated_from_content_alike_for_jsonl_parquet_and_zstd(
    tokenized, same_documents, tmp_path, tokenizer_at_hand
):
    """The same 536 documents as JSONL, Parquet and zstd: their tokens are estimated from a
    sample of their text, whatever the bytes on disk; a budget that reads them ~2.7 times is
    not refused under data.max_epochs=4, and one far past the limit still is."""
    from pipeline.data import mixture
    from pipeline.data.tokenizer import load

    folder, texts = same_documents
    model = RunPaths.of(tokenized.workdir).tokenizer_model
    counted = sum(len(ids) + 1 for ids in load(model).encode(texts))  # as tokenize counts
    given = [f"tokenizer.model={model}"] if tokenizer_at_hand else ["tokenizer.vocab_size=512"]
    tolerance = 0.1 if tokenizer_at_hand else 0.35  # a tokenizer measured, or a typical one
    steps = round(2.7 * counted * 0.9 / (8 * 64))  # ~2.7 epochs of the 90% training split
    for name in ("corpus.jsonl", "corpus.parquet", "corpus.jsonl.zst"):
        cfg = make_config(
            tmp_path / f"run-{name}",
            f"data.inputs=[{folder / name}]",
            *given,
            "model.seq_length=64",
            "train.global_batch_size=8",
            "train.micro_batch_size=8",
            f"train.steps={steps}",
            "data.max_epochs=4",
        )
        tokens, how = mixture.known_train_tokens(cfg)
        share = Split.of(cfg.data.split).shares[0]
        assert abs(tokens["corpus"] / share / counted - 1) < tolerance, (name, tokens, counted)
        assert how.startswith("estimated from a sample")
        assert mixture.too_many_epochs(cfg, (tokens, how)) is None, name
        far = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps * 3))
        assert mixture.too_many_epochs(far, (tokens, how)).startswith("train.steps: "), name


def test_text_files_are_one_document_each(tmp_path):
    (tmp_path / "a.txt").write_text("Chapter one.\n\n  It began.\n")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(b"second book"))
    (tmp_path / "c.txt").write_bytes(b"")
    (tmp_path / "d.txt").write_bytes(b"\xff\xfe not utf-8")
    got = [
        (Path(s).name, item.reason if isinstance(item, Reject) else item.text)
        for s in sorted(map(str, tmp_path.iterdir()))
        for item in read(Span(s), "text", 10**6, fmt="text")
    ]
    assert got == [
        ("a.txt", "Chapter one.\n\n  It began.\n"),
        ("b.txt.gz", "second book"),
        ("c.txt", "empty_text"),
        ("d.txt", "invalid_utf8"),
    ]


def test_row_filters_select_rows_and_count_the_rest(tmp_path):
    path = tmp_path / "edu.parquet"
    write_parquet(
        path,
        [f"doc {i}" for i in range(10)],
        3,
        language_score=[0.5, 0.95, None, 0.99, 0.91, 0.2, 0.97, 0.9, 0.1, 0.93],
        dump=["a", "b"] * 5,
    )
    where = "language_score >= 0.9 and (dump == 'b' or language_score > 0.98)"
    items = list(read(Span(str(path)), "text", 10**6, where=where))
    assert documents(items) == ["doc 1", "doc 3", "doc 7", "doc 9"]
    assert sum(i.rows for i in items if isinstance(i, Filtered)) == 6
    with pytest.raises(ConfigError, match="reads column 'missing'"):
        list(read(Span(str(path)), "text", 10**6, where="missing > 1"))
    for bad in ("score >=", "score = 1", "a > 1 and", "(a > 1", "a > b", "__import__('os')"):
        with pytest.raises(row_filter.BadFilter):
            row_filter.parse(bad)


def test_rows_a_filter_leaves_out_are_reported_and_a_filter_that_leaves_none_is_named(
    tokenized, tmp_path, capsys
):
    from pipeline.data.steps import TOKENIZE, TOKENIZER, VERIFY

    path = tmp_path / "web.parquet"
    texts = [f"page {i} " + "word " * (i % 9) for i in range(300)]
    write_parquet(path, texts, 3, lang=["en", "en", "de"] * 100)
    model = f"tokenizer.model={RunPaths.of(tokenized.workdir).tokenizer_model}"

    def tokenize(where: str):
        cfg = make_config(
            tmp_path / where.split("'")[1], f"data.inputs=[{path}]", f"data.where={where}", model
        )
        TOKENIZE.prepare(cfg)
        for step in (TOKENIZER, TOKENIZE):
            step.run(cfg)
        return VERIFY.run(cfg)

    manifest = tokenize("\"lang == 'en'\"")
    assert manifest["total"]["documents"] == 200 and manifest["total"]["filtered"] == 100
    said = capsys.readouterr().err
    assert "rows left out by data.where" in said  # each tokenize task's line
    assert "source corpus: data.where \"lang == 'en'\" left out 100 of 300 rows" in said
    with pytest.raises(StageError) as refused:
        tokenize("\"lang == 'fr'\"")
    assert str(refused.value).startswith(
        "data.where: \"lang == 'fr'\" left out all 300 rows of source corpus that were read"
    )
    few = {**manifest["sources"]["corpus"], "documents": 3, "filtered": 297}
    few["split_tokens"] = {"train": 30, "validation": 2, "test": 2}
    with pytest.raises(ConfigError, match=r"^data.where: left out 297 of the 300 rows of source"):
        check_splits({"split": "90,5,5", "sources": {"corpus": few}}, 64, ("train",))


def test_a_bad_filter_or_format_is_one_config_error_naming_the_key(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "a"}\n')
    base = (f"+data.sources.web={{inputs:[{tmp_path}/x.jsonl]}}", "data.inputs=[]")
    with pytest.raises(ConfigError, match=r"^data.sources.web.where: 'score >> 1'"):
        make_config(tmp_path / "run", *base, "+data.sources.web.where='score >> 1'")
    with pytest.raises(ConfigError, match=r"^data.sources.web.format: 'csv'"):
        make_config(tmp_path / "run", *base, "+data.sources.web.format=csv")
    with pytest.raises(ConfigError, match=r"^data.format: 'pdf'"):
        make_config(tmp_path / "run", f"data.inputs=[{tmp_path}/x.jsonl]", "data.format=pdf")


def test_a_file_named_twice_is_one_input_read_once_with_one_warning(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    first = [f"first {i}" for i in range(5)]
    second = [f"second {i}" for i in range(3)]
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in first))
    (folder / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in second))
    os.symlink(folder / "a.jsonl", folder / "link.jsonl")
    os.link(folder / "b.jsonl", folder / "hard.jsonl")
    globs = f"data.inputs=[{folder}/*.jsonl,{folder}/../in/a.jsonl]"  # two globs reach a.jsonl
    cfg = make_config(tmp_path / "run", globs, "data.num_shards=2")
    listed = sources.files(RunPaths.of(cfg.workdir), cfg.data)
    assert [Path(p).name for _, p in listed] == ["a.jsonl", "b.jsonl"]
    plan = shards.plan(RunPaths.of(cfg.workdir), cfg.data)
    assert sorted(documents(read_plan(plan))) == sorted(first + second)
    [line] = [x for x in capsys.readouterr().err.splitlines() if "named more than once" in x]
    assert line == (
        "[plan] warning: data.inputs: 2 file(s) named more than once (a link, or two globs) are "
        f"read once each: {folder}/a.jsonl (also {folder}/link.jsonl); "
        f"{folder}/b.jsonl (also {folder}/hard.jsonl)"
    )
    linked = (f"+data.sources.web.inputs=[{folder}/a.jsonl]", "+data.sources.web.weight=1")
    with pytest.raises(ConfigError, match=r"link.jsonl is in data.sources.web too"):
        make_config(
            tmp_path / "two", *linked, f"+data.sources.copy={{inputs:[{folder}/link.jsonl]}}"
        )


def test_ten_thousand_small_files_are_planned_in_seconds(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    payload = zstandard.ZstdCompressor().compress(b'{"text": "small"}\n')
    for i in range(10_000):
        (folder / f"part-{i:05d}.jsonl{'.zst' if i % 2 else ''}").write_bytes(
            payload if i % 2 else b'{"text": "small"}\n'
        )
    cfg = make_config(tmp_path / "run", f"data.inputs=[{folder}/*]", "data.num_shards=64")
    started = time.time()
    plan = shards.plan(RunPaths.of(cfg.workdir), cfg.data)
    assert time.time() - started < 10
    assert len(plan) == 64 and len({s.path for spans in plan for s in spans}) == 10_000


def test_the_same_documents_are_held_out_from_jsonl_and_from_parquet(tokenized, tmp_path):
    from pipeline.data import tokenizer
    from tests.unit.test_tokenize import shard_texts, tokenize_all

    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "as",
        "with",
        "was",
        "on",
        "be",
        "by",
        "this",
        "are",
    ]
    texts = [" ".join(words[(i * 7 + k) % len(words)] for k in range(5 + i % 11)) + f" {i}"
             for i in range(600)]  # fmt: skip
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "corpus.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts)
    )
    write_parquet(tmp_path / "b" / "corpus.parquet", texts[::-1], 6)  # another order, too
    model = f"tokenizer.model={RunPaths.of(tokenized.workdir).tokenizer_model}"
    held_out = []
    for folder, num_shards in (("a", 2), ("b", 3)):
        cfg = make_config(
            tmp_path / f"run-{folder}",
            f"data.inputs=[{tmp_path / folder}/*]",
            f"data.num_shards={num_shards}",
            model,
        )
        markers = tokenize_all(cfg)
        paths = RunPaths.of(cfg.workdir)
        sp = tokenizer.load(paths.tokenizer_model)
        splits = [shard_texts(paths, m["shard"], sp) for m in markers]
        held_out.append(
            {s: sorted(t for by in splits for t in by[s]) for s in ("validation", "test")}
        )
        assert sum(m["documents"] for m in markers) == len(texts)
    assert held_out[0] == held_out[1] and held_out[0]["test"] and held_out[0]["validation"]


def test_bytes_after_the_zstd_frames_that_are_no_frame_are_one_reject_after_the_lines(tmp_path):
    path = tmp_path / "tail.jsonl.zst"
    lines = b"".join(b'{"text": "line %d"}\n' % i for i in range(10))
    path.write_bytes(zstandard.ZstdCompressor().compress(lines) + b"\x00not a frame" * 3)
    assert formats.zstd_frames(str(path)) == [(0, path.stat().st_size)]
    items = list(read(Span(str(path)), "text", 10**6))
    assert documents(items) == [f"line {i}" for i in range(10)]
    assert [(r.line, r.reason) for r in items if isinstance(r, Reject)] == [(11, "truncated_zstd")]


def test_arrow_files_and_streams_are_read_and_a_cut_stream_keeps_its_first_batches(tmp_path):
    table = pa.table({"text": [f"row {i}" for i in range(40)]})
    as_file = tmp_path / "random-access.arrow"
    with pa.OSFile(str(as_file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=10)
    assert formats.kind(str(as_file)) == "arrow"
    assert documents(read(Span(str(as_file)), "text", 10**6)) == table["text"].to_pylist()
    stream = tmp_path / "cut.arrow"
    with pa.OSFile(str(stream), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=10)
    stream.write_bytes(stream.read_bytes()[:-150])  # into the last batch
    items = list(read(Span(str(stream)), "text", 10**6))
    assert documents(items) == [f"row {i}" for i in range(30)]
    assert [(r.line, r.reason) for r in items if isinstance(r, Reject)] == [(31, "damaged_arrow")]
