"""The downstream jobs' parts that need no model: the lease that keeps a checkpoint being scored
from train.keep_last (live and stale, by pid and by Slurm job), which checkpoints training
hands to a scoring job, eval.select_by, the checks on submission, and where the scores show
(summary.json, the report, `make status`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import pipeline.evaluation
from pipeline.core import scores
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.orchestration import graph, status, task_data
from pipeline.reporting.report import write_report
from pipeline.training import checkpoint_records, leases, retention, scoring_jobs
from tests.conftest import SMALL, changed, make_config


def _checkpoints(root: Path, steps: list[int]) -> list[Path]:
    folders = []
    for step in steps:
        folder = root / "checkpoints" / retention.folder_name(step)
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"step": step}))
        folders.append(folder)
    return folders


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_keep_last_spares_a_checkpoint_whose_scoring_job_is_alive_and_not_a_stale_one(tmp_path):
    leased, stale, plain, kept = _checkpoints(tmp_path, [10, 20, 30, 40])
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as scoring:
        try:
            leases.take(leased, scoring.pid)
            leases.take(stale, _ended_pid())  # its job died without removing the lease
            retention.apply(tmp_path / "checkpoints", keep_last=1)
        finally:
            scoring.kill()
    left = sorted(p.name for p in retention.finished(tmp_path / "checkpoints"))
    assert left == [leased.name, kept.name]
    # once the job is done (it released the lease), the next retention deletes it
    leases.release(leased)
    retention.apply(tmp_path / "checkpoints", keep_last=1)
    assert [p.name for p in retention.finished(tmp_path / "checkpoints")] == [kept.name]


def test_a_lease_held_by_a_slurm_job_lasts_while_slurm_says_it_is_queued_or_running(
    tmp_path, monkeypatch
):
    (folder,) = _checkpoints(tmp_path, [10])
    leases.take(folder, _ended_pid())  # the process that submitted the job has exited
    leases.name_job(folder, "4242")
    answers = {"state": "RUNNING"}
    monkeypatch.setattr(
        leases.scheduler, "job_states", lambda ids: (f"{ids}|{answers['state']}|None", "")
    )
    assert leases.holder(folder)["job"] == "4242"
    answers["state"] = "COMPLETED"
    assert leases.holder(folder) is None
    answers["state"] = "PENDING"
    assert leases.holder(folder) is not None


def test_a_lease_of_another_hosts_process_lasts_as_long_as_a_submission_could(tmp_path):
    (folder,) = _checkpoints(tmp_path, [10])
    record = {"pid": 1, "host": "another-node", "job": None, "since": time.time()}
    (folder / leases.LEASE).write_text(json.dumps(record))
    assert leases.holder(folder) is not None  # still submitting, as far as anyone here knows
    record["since"] -= leases.SUBMITTING_S + 1
    (folder / leases.LEASE).write_text(json.dumps(record))
    assert leases.holder(folder) is None  # it would have named its job long ago


def test_every_nth_regular_checkpoint_before_the_last_is_scored_during_training(tmp_path):
    cfg = make_config(tmp_path, *SMALL, "train.save_interval=5", "train.steps=40")
    cfg = changed(cfg, "eval", harness_tasks=["tiny_choice"], harness_every=2)
    due = [step for step in range(1, 41) if scoring_jobs.due(cfg, step)]
    assert due == [10, 20, 30]  # 40, the last, is the downstream step's; 7 a signal's save
    assert not scoring_jobs.due(changed(cfg, "eval", harness_every=0), 10)


def _score(root: Path, step: int, acc: float, tokens: int | None = None) -> None:
    record = {
        "checkpoint": retention.folder_name(step),
        "step": step,
        "tokens": tokens if tokens is not None else step * 512,
        "tasks": {"tiny_choice": {"acc,none": acc, "acc_stderr,none": 0.1, "sample_len": 4}},
    }
    path = RunPaths.of(root).downstream_result(retention.folder_name(step))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_select_by_chooses_the_best_scored_checkpoint_still_kept(tmp_path):
    paths = RunPaths.of(tmp_path)
    _checkpoints(tmp_path, [10, 20, 30])
    (paths.checkpoints / "best.json").write_text(json.dumps({"name": "iter_0000030"}))
    _score(tmp_path, 10, 0.75)
    _score(tmp_path, 20, 0.5)
    _score(tmp_path, 5, 1.0)  # scored, then deleted by retention: does not count
    assert scores.best(paths, "tiny_choice/acc") == "iter_0000010"
    assert checkpoint_records.chosen(paths, "best", "tiny_choice/acc") == "iter_0000010"
    assert checkpoint_records.chosen(paths, "best", None) == "iter_0000030"  # validation loss
    assert scores.best(paths, "tiny_choice/f1") is None  # a metric the task does not have


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["eval.harness_tasks=[tiny_choice]", "eval.select_by=hellaswag/acc"],
            "eval.select_by: task 'hellaswag' is not among eval.harness_tasks (tiny_choice)",
        ),
        (
            ["eval.harness_tasks=[tiny_choice]", "eval.select_by=acc"],
            "eval.select_by: 'acc' is not TASK/METRIC",
        ),
        (["eval.harness_every=2"], "eval.harness_every: needs eval.harness_tasks"),
        (
            ["eval.task_paths=[/no/such/folder]"],
            "eval.task_paths: '/no/such/folder' is not a folder",
        ),
    ],
)
def test_downstream_settings_are_refused_in_one_line_naming_the_key(tmp_path, overrides, line):
    with pytest.raises(ConfigError) as refused:
        make_config(tmp_path, *SMALL, *overrides)
    assert str(refused.value).startswith(line)


def test_tasks_without_data_and_without_network_are_named_before_anything_is_submitted(
    tmp_path, monkeypatch
):
    """The launcher's decision on what missing_task_data finds (pipeline.evaluation.downstream,
    held to the harness by its own tests, stood in for here: it needs torch; the cli test
    launches with a task of eval.task_paths for real)."""
    found = {"missing": ["arc_easy", "hellaswag"]}
    cache = tmp_path / "cache"
    scoring = types.SimpleNamespace(
        missing_task_data=lambda cfg: found["missing"], task_cache=lambda cfg: cache
    )
    monkeypatch.setitem(sys.modules, "pipeline.evaluation.downstream", scoring)
    monkeypatch.setattr(pipeline.evaluation, "downstream", scoring, raising=False)
    monkeypatch.setattr(task_data, "has_network", lambda: False)
    cfg = make_config(tmp_path / "run", *SMALL, "eval.harness_tasks=[hellaswag,arc_easy]")
    with pytest.raises(ConfigError) as refused:
        task_data.check(cfg)
    assert str(refused.value).startswith(
        f"eval.harness_tasks: no data for arc_easy, hellaswag in {cache}, and no network here"
    )
    assert "\n" not in str(refused.value)
    monkeypatch.setattr(task_data, "has_network", lambda: True)
    assert task_data.check(cfg) is True  # fetched once the run folder is held
    found["missing"] = []
    assert task_data.check(cfg) is False  # nothing to fetch


def test_the_downstream_step_is_in_the_graph_only_with_tasks(tmp_path):
    cfg = make_config(tmp_path, *SMALL)
    assert [s.name for s in graph.steps(cfg)][-2:] == ["train", "evaluate"]
    with_tasks = changed(cfg, "eval", harness_tasks=["tiny_choice"])
    assert [s.name for s in graph.steps(with_tasks)][-3:] == ["train", "downstream", "evaluate"]


def test_scores_show_in_the_summary_the_report_and_status(tmp_path):
    paths = RunPaths.of(tmp_path)
    being_scored, done, failed = _checkpoints(tmp_path, [10, 20, 30])
    _score(tmp_path, 20, 0.5)
    _score(tmp_path, 10, 0.25)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as job:
        try:
            leases.take(being_scored, job.pid)
            leases.take(failed, _ended_pid())
            rows = {row[0]: row[1:] for row in status.scoring_rows(paths)}
        finally:
            job.kill()
    assert rows["downstream iter_0000010"][0] == "RUNNING"
    assert rows["downstream iter_0000020"] == ("DONE", "step 20: tiny_choice")
    assert rows["downstream iter_0000030"][0] == "FAILED"
    write_report(paths)
    summary = json.loads(paths.summary.read_text())
    assert [(r["step"], r["tokens"]) for r in summary["downstream"]] == [(10, 5120), (20, 10240)]
    assert summary["downstream"][1]["tasks"]["tiny_choice"]["acc,none"] == 0.5
    report = paths.report.read_text()
    assert "| step | trained tokens | tiny_choice/acc,none |" in report
    assert "| 10 | 5120 | 0.2500 |" in report and "| 20 | 10240 | 0.5000 |" in report
    assert (paths.downstream_dir / "scores.png").read_bytes()[:4] == b"\x89PNG"


def test_a_scoring_process_does_not_join_the_trainings_job_or_rendezvous():
    training = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "29500",
        "SLURM_JOB_ID": "77",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SUBMITIT_EXECUTOR": "slurm",
        "HOME": "/home/a",
        "PYTHONPATH": "/site",
    }
    env = scoring_jobs.job_environment(training)
    assert set(env) == {"HOME", "PYTHONPATH", "SLURM_CONF"}
    root = Path(scoring_jobs.__file__).resolve().parents[2]
    assert env["PYTHONPATH"].split(":") == [str(root), "/site"]
