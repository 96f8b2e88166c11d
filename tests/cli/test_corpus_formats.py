"""A corpus as it is published, as one weighted mixture: FineWeb-like Parquet (several files of
several row groups, a null text, a file whose text column is not text, a row filter), a
.jsonl.zst of two frames and a truncated one, a saved `datasets` folder (Arrow stream files,
dataset_info.json, state.json), and a folder of .txt files, one document each. It tokenizes
and trains (validating on every source), and the manifest accounts for every record read; a
file with no text stops it in one line before anything runs unless the loss is accepted."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from pipeline.core.paths import RunPaths
from tests.cli.test_data_losses import texts as documents
from tests.conftest import SMALL_SERIAL, cli

WHERE = "language_score >= 0.2"


def write_corpus(root: Path) -> dict:
    """The four sources under `root`; returns what each holds: rows written, and those the
    filter leaves out, the rejects expected by reason, complete zstd lines."""
    texts = documents(600, seed=11)
    web, pile, wiki, books = (root / name for name in ("web", "pile", "wiki", "books"))
    for folder in (web, pile, books):
        folder.mkdir(parents=True)
    rng = random.Random(3)
    taken = iter(texts)
    scores = []
    for i in range(3):  # FineWeb's columns: text, id, url, language_score
        rows = [next(taken) for _ in range(60)]
        if i == 1:
            rows[7] = None
        score = [round(rng.random(), 3) for _ in rows]
        scores += score
        table = pa.table(
            {
                "text": rows,
                "id": [f"<urn:uuid:{i}-{k}>" for k in range(60)],
                "url": [f"https://example.org/{i}/{k}" for k in range(60)],
                "language_score": score,
            }
        )
        pq.write_table(table, web / f"train-{i:05d}-of-00003.parquet", row_group_size=16)
    pq.write_table(pa.table({"text": [1, 2], "language_score": [0.9, 0.1]}), web / "ints.parquet")
    lines = [json.dumps({"text": next(taken)}).encode() + b"\n" for _ in range(150)]
    stream = b"".join(lines)
    cuts = [0, len(stream) // 3 + 11, 2 * len(stream) // 3, len(stream)]
    frames = [
        zstandard.ZstdCompressor().compress(stream[a:b])
        for a, b in zip(cuts, cuts[1:], strict=False)
    ]
    frames[-1] = frames[-1][: len(frames[-1]) // 2]
    (pile / "pile.jsonl.zst").write_bytes(b"".join(frames))
    readable = b"".join(zstandard.ZstdDecompressor().decompress(f) for f in frames[:2])
    readable += zstandard.ZstdDecompressor().decompressobj().decompress(frames[2])
    complete = readable.count(b"\n")  # the lines before the damage
    wiki.mkdir()
    names = [f"data-{i:05d}-of-00002.arrow" for i in range(2)]
    for name in names:
        table = pa.table({"text": [next(taken) for _ in range(50)], "id": list(range(50))})
        with (
            pa.OSFile(str(wiki / name), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as writer,
        ):
            writer.write_table(table, max_chunksize=8)
    (wiki / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))
    state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "0", "_split": None}
    (wiki / "state.json").write_text(json.dumps(state))
    for i in range(40):
        (books / f"book-{i:02d}.txt").write_text("\n\n".join(next(taken) for _ in range(3)))
    filtered = sum(s < 0.2 for s in scores) + 1  # ints.parquet's second row, too
    return {
        "web": {"rows": 182, "filtered": filtered},
        "pile": {"rows": complete, "rejected": {"truncated_zstd": 1}},
        "wiki": {"rows": 100},
        "books": {"rows": 40},
    }


def sources(root: Path) -> list[str]:
    return [
        f"+data.sources.web={{inputs:['{root}/web/*.parquet'],weight:3,where:'{WHERE}'}}",
        f"+data.sources.pile={{inputs:['{root}/pile/*'],weight:2}}",
        f"+data.sources.wiki={{inputs:['{root}/wiki'],weight:1}}",
        f"+data.sources.books={{inputs:['{root}/books/*.txt'],weight:1,format:text}}",
    ]


def test_published_formats_as_one_mixture_tokenize_train_and_are_accounted_for(tmp_path):
    expected = write_corpus(tmp_path / "corpus")
    refused = cli(f"workdir={tmp_path / 'refused'}", *SMALL_SERIAL, *sources(tmp_path / "corpus"))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"{tmp_path}/corpus/web/ints.parquet" in refused.stderr.strip().splitlines()[-1]
    workdir = tmp_path / "run"
    result = cli(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        *sources(tmp_path / "corpus"),
        "data.num_shards=4",
        "data.max_reject_fraction=1",  # ints.parquet holds no text: counted, not refused
        "stages=[tokenize,train]",
        "train.steps=10",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads(RunPaths.of(workdir).manifest.read_text())
    described = manifest["sources"]
    for name, want in expected.items():
        got = described[name]
        read = got["documents"] + got["no_token_documents"] + sum(got["rejected"].values())
        assert read + got["filtered"] == want["rows"] + sum(want.get("rejected", {}).values()), name
        assert got["filtered"] == want.get("filtered", 0), name
    assert described["web"]["rejected"] == {"null_text": 1, "text_not_string": 1}
    assert described["pile"]["rejected"] == {"truncated_zstd": 1}
    assert manifest["total"]["filtered"] == expected["web"]["filtered"]
    plan = json.loads(RunPaths.of(workdir).shard_plan.read_text())
    assert len(plan["shards"]) == 4
    rejects = "".join(p.read_text() for p in (workdir / "data" / "rejects").glob("*"))
    assert '"reason": "null_text"' in rejects and '"unit": "row"' in rejects
    metrics = [json.loads(line) for line in (workdir / "train" / "metrics.jsonl").open()]
    validation = next(r for r in metrics if "val_loss" in r)
    assert {f"val_loss/{name}" for name in expected} <= set(validation)
