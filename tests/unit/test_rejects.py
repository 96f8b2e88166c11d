"""What verify makes of the tokenize tasks' counts (pipeline.data.rejects): a file none of whose
records became a document, wherever its records were, stops the run naming it; past
data.max_reject_fraction the run stops; 1 accepts any loss."""

from __future__ import annotations

import pytest

from pipeline.core.errors import StageError
from pipeline.core.paths import RunPaths
from pipeline.data.rejects import NOT_REJECTS, refuse_rejects
from tests.conftest import make_config


def marker(inputs: dict[str, dict[str, int]]) -> dict:
    rejected: dict[str, int] = {}
    for counts in inputs.values():
        for reason, n in counts.items():
            if reason not in NOT_REJECTS:
                rejected[reason] = rejected.get(reason, 0) + n
    spans = [["corpus", path, 0, None] for path in inputs]
    return {"spans": spans, "inputs": inputs, "rejected": rejected}


def test_a_file_with_records_and_no_document_stops_the_run(tmp_path):
    cfg = make_config(tmp_path, "data.max_reject_fraction=0.9", validate=False)
    shards = [
        marker({"/d/a.jsonl": {"documents": 500}, "/d/b.jsonl": {"missing_text": 120}}),
        marker({"/d/b.jsonl": {"missing_text": 80}}),  # the same file's second part
    ]
    with pytest.raises(StageError) as refused:
        refuse_rejects(cfg.data, shards, RunPaths.of(tmp_path))
    assert str(refused.value) == (
        "data.text_key: all 200 records of /d/b.jsonl have no 'text' field; set "
        "data.text_key to the field its records hold the text in (each with its line in "
        f"{tmp_path / 'data' / 'rejects'})"
    )


def test_the_reject_share_is_over_all_records_and_one_accepts_any_loss(tmp_path):
    shards = [marker({"/d/a.jsonl": {"documents": 97, "malformed_json": 3}})]
    strict = make_config(tmp_path, validate=False).data
    with pytest.raises(StageError, match=r"^data.max_reject_fraction: 3 of 100 records \(3.0%\)"):
        refuse_rejects(strict, shards, RunPaths.of(tmp_path))
    refuse_rejects(
        make_config(tmp_path, "data.max_reject_fraction=0.05").data, shards, RunPaths.of(tmp_path)
    )
    lost = [marker({"/d/a.jsonl": {"documents": 10}, "/d/b.jsonl": {"invalid_utf8": 50}})]
    refuse_rejects(
        make_config(tmp_path, "data.max_reject_fraction=1").data, lost, RunPaths.of(tmp_path)
    )


def test_a_damaged_file_weighs_what_it_lost_and_an_unknown_loss_is_refused(tmp_path):
    paths = RunPaths.of(tmp_path)
    # a zstd file cut short after 209 of its 536 records: one reject, 326 predicted lost
    cut = {"documents": 209, "truncated_zstd": 1, "predicted_lost": 326}
    shards = [marker({"/d/cut.jsonl.zst": cut, "/d/a.jsonl": {"documents": 10_000}})]
    with pytest.raises(StageError) as refused:
        refuse_rejects(make_config(tmp_path, validate=False).data, shards, paths)
    assert str(refused.value).startswith(
        "data.max_reject_fraction: 327 of 10,536 records (3.1%) were rejected or lost to "
        "damaged files (predicted_lost after damage 326, truncated_zstd 1), more than 1.0%"
    )
    accepting = make_config(tmp_path, "data.max_reject_fraction=0.05").data
    assert refuse_rejects(accepting, shards, paths) == [
        "warning: /d/cut.jsonl.zst is damaged (truncated_zstd 1): ~326 records lost after the "
        "damage, accepted by data.max_reject_fraction=0.05"
    ]
    unknown = {"documents": 5000, "truncated_gzip": 1, "unknown_loss": 1}
    shards = [marker({"/d/cut.jsonl.gz": unknown})]
    with pytest.raises(StageError, match=r"^data.max_reject_fraction: /d/cut.jsonl.gz is damaged"):
        refuse_rejects(accepting, shards, paths)
    anything = make_config(tmp_path, "data.max_reject_fraction=1").data
    [warning] = refuse_rejects(anything, shards, paths)
    assert "an unknown number of records lost" in warning


def test_the_report_shows_the_records_lost_and_the_rows_filtered_out():
    from pipeline.reporting.report import _data_section

    total = {"rejected": {"truncated_zstd": 1}, "predicted_lost": 326, "filtered": 12}
    rows = dict(_data_section({"total": total, "sources": {}}, {})[1][2])
    assert rows["records lost to damaged files (predicted)"] == 326
    assert rows["rows left out by row filters"] == 12
    plain = dict(_data_section({"total": {"rejected": {}}, "sources": {}}, {})[1][2])
    assert "records lost to damaged files (predicted)" not in plain
