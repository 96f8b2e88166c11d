"""Published corpus formats as one mixture on a real Slurm cluster: Parquet row groups, zstd
frames, a saved `datasets` folder and text files tokenize as an array job, one task a shard,
then train; the manifest accounts for every record."""

from __future__ import annotations

import json

from pipeline.core.paths import RunPaths
from tests.cli.test_corpus_formats import sources, write_corpus
from tests.conftest import SMALL
from tests.slurm.test_pipeline_on_slurm import pipeline, wait_for


def test_published_formats_tokenize_as_an_array_and_train(slurm_cluster, tmp_path):
    expected = write_corpus(tmp_path / "corpus")
    workdir = tmp_path / "run"
    pipeline(
        "cluster=slurm",
        f"workdir={workdir}",
        *SMALL,
        *sources(tmp_path / "corpus"),
        "data.num_shards=4",
        "data.max_reject_fraction=1",  # ints.parquet holds no text: counted, not refused
        "stages=[tokenize,train]",
        "train.steps=10",
    )
    states = wait_for(workdir, 900)
    assert all(r["state"] == "COMPLETED" for rs in states.values() for r in rs), states
    assert len(states["tokenize"]) == 4  # one array task a shard
    manifest = json.loads(RunPaths.of(workdir).manifest.read_text())
    for name, want in expected.items():
        got = manifest["sources"][name]
        read = got["documents"] + got["no_token_documents"] + sum(got["rejected"].values())
        assert read + got["filtered"] == want["rows"] + sum(want.get("rejected", {}).values()), name
    assert (workdir / "train" / "metrics.jsonl").exists()
