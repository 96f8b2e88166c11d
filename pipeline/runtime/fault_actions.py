"""What a training job does about a fault its watchdog found, and the record of it in
train/failures.jsonl (time, attempt, kind, ranks, nodes, steps and seconds lost, action).

Under Slurm the job puts itself back in the queue without the nodes implicated in this job's
faults (`--exclude`), up to cluster.max_restarts times. A fault of the same kind at the same
step as the one before it means the restart made no progress: the run stops there, in one
line, instead of looping. Elsewhere (cluster.executor=subprocess) the attempt just ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from pipeline.core import log

_log = log.get("watchdog")


def earlier(failures: Path, job: str | None) -> list[dict]:
    """This job's fault records so far (all of them outside Slurm)."""
    try:
        lines = failures.read_text().splitlines()
    except OSError:
        return []
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r.get("job") == job]


def recorded_since(failures: Path, attempt: int, since: float) -> bool:
    """Whether another node recorded a fault of this attempt since `since`."""
    job = os.environ.get("SLURM_JOB_ID")
    for r in earlier(failures, job):
        at = time.mktime(time.strptime(r["time"], "%Y-%m-%dT%H:%M:%S"))
        if r["attempt"] == attempt and at >= int(since):
            return True
    return False


def decide(
    record: dict, before: list[dict], max_restarts: int, nodes: set[str] | None = None
) -> tuple[str, list[str]]:
    """The action for a fault, and the nodes to leave out of the next attempt. `nodes`: those
    of the partition, when known; the job needs as many as it has now left without them
    (else only this fault's nodes are left out, or none can be and the run stops)."""
    if record.get("job") is None:
        return "ended the attempt", []
    last = before[-1] if before else None
    repeated = last and last["attempt"] < record["attempt"] and last["kind"] == record["kind"]
    if repeated and last["step"] == record["step"]:
        return (
            f"stopped: a {record['kind']} at step {record['step']} again after a restart, "
            "which made no progress",
            [],
        )
    restarts = [r for r in before if r["action"].startswith("requeued")]
    if len(restarts) >= max_restarts:
        return f"stopped: {len(restarts)} restarts reached cluster.max_restarts", []
    needed = record.get("job_nodes", 0)
    for excluded in (
        {n for r in restarts for n in r["nodes"]} | set(record["nodes"]),
        set(record["nodes"]),
    ):
        if nodes is None or len(nodes - excluded) >= needed:
            return f"requeued without {','.join(sorted(excluded))}", sorted(excluded)
    return (
        f"stopped: without {','.join(record['nodes'])} the partition has fewer than the "
        f"{needed} nodes the job needs",
        [],
    )


def partition_nodes() -> set[str] | None:
    """The nodes of this job's partition that are up, by Slurm; None: not known."""
    partition = os.environ.get("SLURM_JOB_PARTITION")
    if not partition:
        return None
    try:
        shown = subprocess.run(
            ["sinfo", "-h", "-N", "-p", partition, "-t", "idle,alloc,mix", "-o", "%N"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(shown.stdout.split()) if shown.returncode == 0 else None


def requeue_without(job: str, nodes: list[str]) -> None:
    """Back in the queue, never again on `nodes`: held as it is requeued, so that it cannot
    start before its excluded nodes are set (Slurm changes them only on a pending job)."""
    for args in (
        ["requeuehold", job],
        ["update", f"JobId={job}", f"ExcNodeList={','.join(nodes)}"],
        ["release", job],
    ):
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            _log.error(f"scontrol {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def handle(failures: Path, record: dict, max_restarts: int) -> str:
    """Decide, record and act; returns the action."""
    job = os.environ.get("SLURM_JOB_ID")
    record = {**record, "job": job, "job_nodes": int(os.environ.get("SLURM_JOB_NUM_NODES", 1))}
    action, excluded = decide(record, earlier(failures, job), max_restarts, partition_nodes())
    record["action"] = action
    with open(failures, "a") as f:  # one short line: a single write, whole
        f.write(json.dumps(record) + "\n")
    _log.error(f"{record['kind']} at step {record['step']}: {action}")
    if job and excluded:
        requeue_without(job, excluded)
    return action
