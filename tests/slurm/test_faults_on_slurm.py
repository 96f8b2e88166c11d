"""Faults a cluster adds, on a real local Slurm cluster: an administrator's scancel of the
training job sticks, and rerunning the same command resumes it; the node going DOWN under it
makes Slurm requeue the job, which resumes from its last checkpoint. Both end with the loss
curve of a run that was never interrupted, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint
from tests.conftest import ROOT, SMALL_SERIAL, cli, loss_curve

# Long enough to act on the job between its first checkpoint and its end.
TRAIN = [
    *SMALL_SERIAL,
    "train.steps=200",
    "train.save_interval=20",
    "train.eval_interval=20",
    "train.log_interval=1",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """Tokenized data, trained locally without interruption."""
    workdir = tmp_path_factory.mktemp("reference")
    result = cli(f"workdir={workdir}", *TRAIN, "stages=[tokenize,train]")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def submit(workdir: Path, reference: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "cluster=slurm", f"workdir={workdir}"]
        + [*TRAIN, f"data.prepared={reference}", "stages=[train]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def train_job(workdir: Path) -> str:
    return json.loads((workdir / "jobs.json").read_text())[-1]["jobs"]["train"][0]


def state(job: str) -> str:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job, "-o", "State"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    return out[0] if out else "UNKNOWN"


def in_queue(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=60)
    return bool(out.stdout.strip())


def wait(predicate: Callable[[], bool], what: str, timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def wait_for_first_checkpoint(workdir: Path) -> None:
    tracker = RunPaths.of(workdir).checkpoints / checkpoint.TRACKER
    wait(tracker.exists, "the first checkpoint")


def job_log(workdir: Path, job: str) -> str:
    return "".join(
        p.read_text() for p in (workdir / "logs" / "jobs" / "train" / job).glob("*_log.err")
    )


def test_a_cancelled_training_job_stays_cancelled_and_the_rerun_resumes(
    slurm_cluster, reference, tmp_path
):
    workdir = tmp_path / "run"
    submit(workdir, reference)
    job = train_job(workdir)
    wait_for_first_checkpoint(workdir)
    subprocess.run(["scancel", job], check=True, timeout=60)
    wait(lambda: state(job) == "CANCELLED" and not in_queue(job), "the cancellation", 120)
    time.sleep(15)  # long enough for a job that requeued itself to be back in the queue
    assert state(job) == "CANCELLED" and not in_queue(job)
    status = subprocess.run(
        [sys.executable, "-m", "pipeline.status", f"workdir={workdir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 1 and "CANCELLED" in status.stdout
    saved = checkpoint.latest(RunPaths.of(workdir).checkpoints)

    again = submit(workdir, reference)
    assert "already complete: index" in again.stderr
    resubmitted = train_job(workdir)
    assert resubmitted != job
    wait(lambda: state(resubmitted) == "COMPLETED", "the resubmitted job")
    assert f"resumed from {saved} at step" in job_log(workdir, resubmitted)
    assert loss_curve(workdir) == loss_curve(reference)


def test_a_node_going_down_under_training_requeues_it_and_it_resumes(
    slurm_cluster, reference, tmp_path
):
    workdir = tmp_path / "run"
    submit(workdir, reference)
    job = train_job(workdir)
    wait_for_first_checkpoint(workdir)
    node = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True).stdout
    down = ["scontrol", "update", f"nodename={node.strip()}", "state=down", "reason=fault-test"]
    try:
        subprocess.run(down, check=True, timeout=60)
        wait(lambda: state(job) in ("REQUEUED", "PENDING", "NODE_FAIL"), "the node failure", 120)
    finally:  # whatever happened, give the node back to the other tests
        subprocess.run(
            ["scontrol", "update", f"nodename={node.strip()}", "state=resume"],
            capture_output=True,
            timeout=60,
        )
    wait(lambda: state(job) == "COMPLETED", "the requeued job")
    assert "resumed from" in job_log(workdir, job)
    assert loss_curve(workdir) == loss_curve(reference)
