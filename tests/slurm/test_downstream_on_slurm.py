"""Downstream tasks on a real Slurm cluster: the training job submits a job of its own for its
step-10 checkpoint (eval.harness_every=1) and goes on; the downstream job, chained after
training, scores the last one; the scores by step reach summary.json and the report."""

from __future__ import annotations

import json
import re
import time

from tests import downstream_task
from tests.conftest import SMALL
from tests.slurm.test_pipeline_on_slurm import pipeline, sacct, wait_for


def test_each_kept_checkpoint_is_scored_by_a_slurm_job_of_its_own(slurm_cluster, tmp_path):
    tasks = downstream_task.write(tmp_path / "tasks")
    workdir = tmp_path / "run"
    pipeline("cluster=local", f"workdir={workdir}", *SMALL, "stages=[tokenize]")
    submitted = pipeline(
        "cluster=slurm",
        f"workdir={workdir}",
        *SMALL,
        "stages=[train,evaluate]",
        "eval.harness_tasks=[tiny_choice]",
        f"eval.task_paths=[{tasks}]",
        "eval.harness_every=1",
    )
    for step in ("index", "train", "downstream", "evaluate"):
        assert f"{step}: submitted job" in submitted.stderr
    states = wait_for(workdir, 900)
    assert all(r["state"] == "COMPLETED" for rs in states.values() for r in rs), states
    # the training's submission of the step-10 checkpoint's job, and that job
    said = (workdir / "logs" / "jobs" / "downstream" / "iter_0000010.log").read_text()
    job = re.search(r"downstream iter_0000010: submitted job (\d+)", said)
    assert job, said
    deadline = time.time() + 600
    while sacct([job[1]])[job[1]]["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
        assert time.time() < deadline, sacct([job[1]])
        time.sleep(3)
    assert sacct([job[1]])[job[1]]["state"] == "COMPLETED"
    launched = json.loads((workdir / "jobs.json").read_text())[-1]["jobs"]
    assert job[1] not in {j for ids in launched.values() for j in ids}  # a job of its own
    scored = {
        step: json.loads((workdir / "eval" / "downstream" / f"iter_{step:07d}.json").read_text())
        for step in (10, 20)
    }
    assert all(set(r["tasks"]) == {"tiny_choice"} for r in scored.values())
    assert not (workdir / "checkpoints" / "iter_0000010" / "SCORING.json").exists()
    summary = json.loads((workdir / "summary.json").read_text())
    assert [r["step"] for r in summary["downstream"]] == [10, 20]
    assert "## Downstream tasks\n" in (workdir / "report.md").read_text()
