"""summary.json and the report name each token count for what it counts: the training split,
all splits, the tokens trained on."""

from __future__ import annotations

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.reporting.report import report_blocks
from pipeline.reporting.summary import write_summary

SPLITS = {"train": 900, "validation": 60, "test": 40}


def _run(tmp_path) -> RunPaths:
    paths = RunPaths.of(tmp_path)
    total = {"tokens": 1100, "split_tokens": SPLITS, "rejected": {}, "documents": 10}
    manifest = {"total": total, "vocab_size": 1000, "sources": {}, "shards": []}
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(paths.manifest, manifest)
    paths.train_done.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(paths.train_done, {"tokens": 900, "trained_tokens": 4096, "train_steps": 4})
    return paths


def test_each_token_count_says_what_it_counts(tmp_path):
    paths = _run(tmp_path)
    summary = write_summary(paths, {})
    assert summary["train_split_tokens"] == 900 and summary["all_splits_tokens"] == 1000
    assert summary["trained_tokens"] == 4096
    assert summary["tokens"] == 900  # the name of earlier versions, still readable
    rows = [row for block in report_blocks(paths, {}) if block[0] == "table" for row in block[2]]
    labels = {row[0]: row[1] for row in rows if len(row) == 2}
    assert labels["tokens of all splits"] == 1000 and "tokens" not in labels
    assert labels["train_split_tokens"] == 900 and labels["trained_tokens"] == 4096
