"""Downstream tasks scored by jobs of their own on a local run: with eval.harness_every=1 the
training starts a process for its step-10 checkpoint and goes on without waiting, the
checkpoint outlives train.keep_last=1 while it is scored, the downstream step scores the last
one after training, the evaluation takes the best scored checkpoint (eval.select_by), and the
scores by step reach summary.json, the report and `make status`. The task is the tests' own
(tests/downstream_task.py): a YAML with its data on local disk, through eval.task_paths."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from pipeline.core import scores
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint
from tests import downstream_task
from tests.conftest import SMALL_SERIAL, cli, copy_tokenized, status


def _wait_for_job(paths: RunPaths, name: str, timeout_s: float = 180) -> dict:
    """The scores of checkpoint `name` once its job is done: it released the lease, last."""
    result, lease = paths.downstream_result(name), paths.checkpoints / name / "SCORING.json"
    deadline = time.time() + timeout_s
    while not result.exists() or lease.exists():
        assert time.time() < deadline, f"the scoring of {name} did not end in {timeout_s} s"
        time.sleep(0.5)
    return json.loads(result.read_text())


def test_each_kept_checkpoint_is_scored_by_its_own_job_while_training_goes_on(tokenized, tmp_path):
    tasks = downstream_task.write(tmp_path / "tasks")
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    result = cli(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        "stages=[train,evaluate]",
        "train.keep_last=1",
        "eval.harness_tasks=[tiny_choice]",
        f"eval.task_paths=[{tasks}]",
        "eval.harness_every=1",
        "eval.select_by=tiny_choice/acc",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    paths = RunPaths.of(workdir)
    started = re.search(r"downstream: scoring iter_0000010 in pid (\d+)", result.stderr)
    assert started, result.stderr[-3000:]
    assert "scoring iter_0000020" not in result.stderr  # the last: the downstream step's
    assert "[pipeline] downstream: done" in result.stderr
    during = _wait_for_job(paths, "iter_0000010")
    after = _wait_for_job(paths, "iter_0000020")
    assert (during["step"], during["tokens"]) == (10, 10 * 512)
    assert (after["step"], after["tokens"]) == (20, 20 * 512)
    assert set(during["tasks"]) == set(after["tasks"]) == {"tiny_choice"}
    # its own process, with its own log, that training did not wait for: the scoring (seconds
    # of imports) ended after the training (10 tiny steps), and held the checkpoint meanwhile
    log = paths.downstream_log("iter_0000010").read_text()
    assert "downstream: iter_0000010 (step 10): downstream/tiny_choice/acc" in log
    scored_at = paths.downstream_result("iter_0000010").stat().st_mtime
    assert paths.train_done.stat().st_mtime < scored_at
    assert (paths.checkpoints / "iter_0000010").is_dir()  # keep_last=1 left it to its job
    # the evaluation read the best scored checkpoint
    evaluated = json.loads(paths.eval_done.read_text())["checkpoint"]
    assert Path(evaluated).name == scores.best(paths, "tiny_choice/acc")
    with pytest.raises(ConfigError) as none_scored:  # a metric the task has not
        checkpoint.verified(paths.checkpoints, "best", "tiny_choice/f1")
    assert str(none_scored.value).startswith("eval.select_by=tiny_choice/f1: no checkpoint under ")
    # the scores by step: summary.json (rewritten by the job that ended last), the report
    summary = json.loads(paths.summary.read_text())
    assert [r["step"] for r in summary["downstream"]] == [10, 20]
    report = paths.report.read_text()
    assert "## Downstream tasks\n" in report
    for record in (during, after):
        acc = record["tasks"]["tiny_choice"]["acc,none"]
        assert f"| {record['step']} | {record['tokens']} | {acc:.4f} |" in report
    shown = status(workdir).stdout
    assert re.search(r"downstream iter_0000010\s+DONE\s+step 10: tiny_choice", shown), shown
    assert re.search(r"downstream iter_0000020\s+DONE\s+step 20: tiny_choice", shown), shown
    for step in ("train", "downstream", "evaluate"):  # a rerun scores nothing again
        assert re.search(rf"\n  {step}\s+COMPLETE\s", shown), shown
