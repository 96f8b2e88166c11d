"""The pipeline on a real Slurm cluster: the job graph, a failure cancelling what depends on it,
a training job requeueing itself across time limits, and a sweep."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SMALL

DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def pipeline(
    *args: str, module: str = "pipeline", check: bool = True
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def sacct(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """Latest allocation row of each job (array tasks as ID_N)."""
    ids = ",".join(sorted({j.split("_")[0] for j in job_ids}))
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ids, "-o", "JobID,State,Start,End,NodeList"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    rows = {}
    for line in out.splitlines():
        job, state, start, end, nodes = line.split("|")
        rows[job] = {"state": state.split()[0], "start": start, "end": end, "nodes": nodes}
    for job in job_ids:  # array tasks that never started come as one row, ID_[0-1]
        grouped = [v for k, v in rows.items() if k.startswith(job.split("_")[0] + "_[")]
        rows.setdefault(job, grouped[0] if grouped else {"state": "UNKNOWN"})
    return rows


def wait_for(
    workdir: Path, timeout_s: float, ended: set[str] = DONE
) -> dict[str, list[dict[str, str]]]:
    """Wait until every job of the latest submission is in a state of `ended`; their rows by
    step."""
    jobs = json.loads((workdir / "jobs.json").read_text())[-1]["jobs"]
    deadline = time.time() + timeout_s
    while True:
        rows = sacct([j for ids in jobs.values() for j in ids])
        states = {
            step: [rows.get(j, {"state": "UNKNOWN"}) for j in ids] for step, ids in jobs.items()
        }
        if all(r["state"] in ended for rs in states.values() for r in rs):
            return states
        assert time.time() < deadline, f"jobs still running: {states}"
        time.sleep(3)


def test_the_whole_graph_runs_as_chained_jobs(slurm_cluster, tmp_path):
    workdir = tmp_path / "run"
    started = time.time()
    every_stage = ["cluster.tasks_per_node=2", "stages=[tokenize,train,evaluate,export]"]
    submitted = pipeline("cluster=slurm", f"workdir={workdir}", *SMALL, *every_stage)
    assert time.time() - started < 60, "submission must return at once"
    for step in ("tokenizer", "tokenize", "verify", "index", "train", "evaluate", "export"):
        assert f"{step}: submitted job" in submitted.stderr
    states = wait_for(workdir, 600)
    assert all(r["state"] == "COMPLETED" for rs in states.values() for r in rs), states
    plan = json.loads((workdir / "data" / "plan.json").read_text())
    assert len(states["tokenize"]) == len(plan["shards"]) == 2  # one array task per shard
    assert len({r["nodes"] for r in states["tokenize"]}) == 2  # the array spreads over nodes
    order = ["tokenizer", "tokenize", "verify", "index", "train", "evaluate", "export"]
    for before, after in zip(order, order[1:], strict=False):
        assert max(r["end"] for r in states[before]) <= min(r["start"] for r in states[after])
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["train_steps"] == 20 and summary["test_ppl"] < 512
    status = pipeline(f"workdir={workdir}", module="pipeline.status")
    assert status.stdout.count("COMPLETE") == 7
    assert json.loads((workdir / "export" / "export.json").read_text())["checkpoint_step"] == 20
    again = pipeline("cluster=slurm", f"workdir={workdir}", *SMALL, *every_stage)
    assert "submitted job" not in again.stderr
    done = "already complete: tokenizer, tokenize, verify, index, train, evaluate, export"
    assert done in again.stderr


def test_a_failed_step_cancels_the_steps_after_it(slurm_cluster, tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": broken\n' * 50)  # nothing a tokenizer could train on
    workdir = tmp_path / "run"
    # every loss accepted, so that the launch submits it and the tokenizer job fails
    accept = "data.max_reject_fraction=1"
    pipeline("cluster=slurm", f"workdir={workdir}", *SMALL, f"data.inputs=[{corpus}]", accept)
    states = wait_for(workdir, 300)
    assert states["tokenizer"][0]["state"] == "FAILED"
    for step in ("tokenize", "verify", "index", "train", "evaluate"):
        assert all(r["state"] == "CANCELLED" for r in states[step]), states
    status = pipeline(f"workdir={workdir}", module="pipeline.status", check=False)
    assert status.returncode == 1
    assert "cancelled because tokenizer failed" in status.stdout


@pytest.mark.timeout(1800)
def test_training_requeues_itself_across_time_limits_and_finishes(slurm_cluster, tmp_path):
    workdir = tmp_path / "run"
    # The first 1-minute window leaves about 25 s to train after start-up (about 50 steps on
    # an idle 2-core machine); the local cluster signalled each requeued job about 17 s after
    # it started again, so later windows train for a few seconds each: 120 steps take several
    # windows, a loaded machine more.
    steps = 120
    pipeline(
        "cluster=slurm",
        f"workdir={workdir}",
        "stages=[tokenize,train]",
        "data.builtin_corpus_bytes=600000",
        "data.num_shards=2",
        "cluster.time_limit=00:01:00",
        "resilience.exit_signal_lead_s=12",
        f"train.steps={steps}",
        "train.save_interval=40",
        "train.eval_interval=40",
        "resilience.max_requeues=50",  # a loaded machine makes each window short
    )
    states = wait_for(workdir, 1700)
    assert states["train"][0]["state"] == "COMPLETED", states
    done = json.loads((workdir / "train" / "DONE.json").read_text())
    assert done["train_steps"] == steps
    log = "".join(p.read_text() for p in (workdir / "logs" / "jobs" / "train").glob("*/*.err"))
    requeues = log.count("exiting for requeue")
    assert requeues >= 1, log[-3000:]
    assert log.count("resumed from") == requeues
    steps_logged = [
        json.loads(line)["step"]
        for line in (workdir / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(steps_logged) == steps


def test_a_sweep_gives_one_run_folder_per_point_and_a_summary(slurm_cluster, tmp_path):
    base = tmp_path / "base"
    pipeline("cluster=local", f"workdir={base}", *SMALL, "stages=[tokenize]")
    result = pipeline(
        "-m",
        "hydra/launcher=submitit_slurm",
        f"workdir={base}",
        *SMALL,
        "stages=[train,evaluate]",
        "train.hold_global_batch=true",
        "train.grad_accum=1,2",
        f"hydra.launcher.submitit_folder={tmp_path}/submitit/%j",
        "hydra.launcher.timeout_min=10",
    )

    def overrides(point: Path) -> list[str]:
        return json.loads((point.parent / "sweep_point.json").read_text())["overrides"]

    # each point's folder is named by its overrides: ordered here by grad_accum
    points = sorted(
        (base / "sweep").glob("*/summary.json"), key=lambda p: "train.grad_accum=2" in overrides(p)
    )
    assert len(points) == 2
    assert ["train.grad_accum=1" in overrides(p) for p in points] == [True, False]
    configs = [(p.parent / "config.yaml").read_text() for p in points]
    assert ["micro_batch_size: 8" in c for c in configs] == [True, False]
    assert "micro_batch_size: 4" in configs[1]  # the global batch (8) held fixed
    table = (base / "sweep" / "summary.md").read_text()
    assert "train.grad_accum=1" in table and "train.grad_accum=2" in table
    assert "Sweep summary" in result.stdout
