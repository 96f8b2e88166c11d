"""summary.json and the report name each token count for what it counts: the training split,
all splits, the tokens trained on; the report shows the plan the launcher wrote."""

from __future__ import annotations

import json

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


def test_the_report_shows_the_plan_the_launcher_wrote(tmp_path):
    from pipeline.planning import run_plan
    from pipeline.reporting import plan_section
    from tests.conftest import GPU_GIVEN, make_config

    cfg = make_config(
        tmp_path, *GPU_GIVEN, "model=gpt-1.3b", "cluster.gpu=H200", "train.recompute=auto"
    )
    plan = run_plan.make(cfg, (32000, "given"))
    run_plan.write(plan, tmp_path)
    report = report_blocks(_run(tmp_path), {})
    blocks = report[report.index(("h2", "Plan")) :][:2]  # after Data, before Training
    assert report.index(("h2", "Plan")) < report.index(("h2", "Training"))
    rows = dict(blocks[1][2])
    assert blocks[0] == ("h2", "Plan") and rows["layout"] == plan.layout.describe()
    assert rows["GPU assumed"] == "H200 (cluster.gpu=H200), NVLink domain 8"
    assert rows["expected tokens/s per GPU"] == f"{plan.step['tokens_per_s_per_gpu']:,.0f}"
    assert rows["chosen"] == cfg.train.auto_choice
    assert plan_section.plan_blocks(None) == []  # a run launched before plans were kept
    cpu = run_plan.make(make_config(tmp_path / "cpu", "model=tiny"), (1000, "given"))
    rows = dict(plan_section.plan_blocks(json.loads(json.dumps(cpu.to_json())))[1][2])
    assert set(rows) == {"layout", "memory per CPU rank (estimate)"}  # no speed model on CPUs


def _router_record(step: int, share: list[float], collapse: dict | None = None) -> dict:
    ratio = max(share) * len(share)
    layer = {"max_over_mean": ratio, "idle_experts": share.count(0.0), "dropped": 0.0}
    record = {"step": step, "tokens": 64 * step, "loss": 5.0, "tokens_per_s": 1.0}
    record.update({"tflops_per_gpu": 0.0, "moe/aux_loss": 1.02, "moe/max_over_mean": ratio})
    record.update({"moe/idle_experts": share.count(0.0), "moe/dropped": 0.0})
    record["moe_layers"] = {"2": {**layer, "share": share}}
    return {**record, "moe_collapse": collapse} if collapse else record


def test_a_mixture_of_experts_report_shows_router_health_and_collapses(tmp_path):
    from pipeline.orchestration.status import _router

    paths = _run(tmp_path)
    even, collapsed = [0.25] * 4, [0.5, 0.5, 0.0, 0.0]
    problem = {"2": "2 of 4 experts received no token"}
    lines = [_router_record(5, even), _router_record(10, collapsed, problem)]
    paths.metrics.write_text("".join(json.dumps(r) + "\n" for r in lines))
    blocks = report_blocks(paths, {})
    at = blocks.index(("h3", "Router health"))
    table, collapses = blocks[at + 2], blocks[at + 4]
    assert table[1][:3] == ("layer", "max / mean", "idle experts")
    assert table[2] == [("2", "2.00", 2, "0.0%", "2 of 4 experts received no token")]
    assert collapses[2] == [(10, "2", "2 of 4 experts received no token")]
    assert (paths.train_dir / "expert_load.png").stat().st_size > 0
    assert "active parameters only" in blocks[at + 1][1]
    assert _router(paths) == (
        "; router at step 10: busiest expert 2.00x mean, 2 idle, 0.0% dropped; "
        "COLLAPSED layer 2: 2 of 4 experts received no token"
    )


def test_a_dense_report_has_no_router_section(tmp_path):
    paths = _run(tmp_path)
    record = {"step": 5, "tokens": 5, "loss": 5.0, "tokens_per_s": 1.0, "tflops_per_gpu": 0.0}
    paths.metrics.write_text(json.dumps(record) + "\n")
    assert ("h3", "Router health") not in report_blocks(paths, {})
