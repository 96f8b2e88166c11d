"""What a training job does about a fault, and the record of it in train/failures.jsonl
(time, attempt, kind, ranks, nodes, steps and seconds lost, action).

A job the pipeline submitted has a supervisor (pipeline.orchestration.supervisor), which
restarts the ranks inside the allocation (`act_on`). A node is set aside once it is implicated
in a hang or a loss, or in two crashes (one may be the software's); a spare node takes its
place. With no spare left or cluster.max_restarts spent in this allocation, the job puts itself
back in the queue without the nodes set aside. Ranks started by a hand-written sbatch script
have none: their node's watchdog requeues the job without the node at fault (`handle`).

Either way, a fault of the same kind at the same step as the one before it means the restart
made no progress: the run stops there, in one line, instead of looping. An out-of-memory is
never retried: it would fail again the same way. Elsewhere (cluster.executor=subprocess) the
attempt just ends.
"""

from __future__ import annotations

import json
import os
import signal
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


def no_progress(record: dict, before: list[dict]) -> str | None:
    """The stop line when `record` repeats the fault before it, at the same step."""
    last = before[-1] if before else None
    repeated = last and last["attempt"] < record["attempt"] and last["kind"] == record["kind"]
    if repeated and last["step"] == record["step"]:
        return (
            f"stopped: a {record['kind']} at step {record['step']} again after a restart, "
            "which made no progress"
        )
    return None


def decide(
    record: dict, before: list[dict], max_restarts: int, nodes: set[str] | None = None
) -> tuple[str, list[str]]:
    """The action for a fault, and the nodes to leave out of the next attempt. `nodes`: those
    of the partition, when known; the job needs as many as it has now left without them
    (else only this fault's nodes are left out, or none can be and the run stops)."""
    if record.get("job") is None:
        return "ended the attempt", []
    stop = no_progress(record, before)
    if stop:
        return stop, []
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


def _outlive_the_requeue() -> None:
    """The requeue signals every process of the job: the commands that follow it must run."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def requeue_without(job: str, nodes: list[str]) -> None:
    """Back in the queue, never again on `nodes`: held as it is requeued, so that it cannot
    start before its excluded nodes are set (Slurm changes them only on a pending job)."""
    for args in (
        ["requeuehold", job],
        ["update", f"JobId={job}", f"ExcNodeList={','.join(nodes)}"],
        ["release", job],
    ):
        done = subprocess.run(
            ["scontrol", *args],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_outlive_the_requeue,
        )
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


def excluded_nodes(failures: Path, job: str) -> set[str]:
    """The nodes this job's faults have set aside so far."""
    return {n for r in earlier(failures, job) for n in r.get("excluded", [])}


def implicated(record: dict, before: list[dict]) -> set[str]:
    """The nodes `record` sets aside: a hang's or a loss's at once, a crash's the second time."""
    if record["kind"] in ("hang", "node lost"):
        return set(record["nodes"])
    crashes = [n for r in [*before, record] if r["kind"] == "crash" for n in r["nodes"]]
    return {n for n in record["nodes"] if crashes.count(n) >= 2}


def decide_supervised(
    record: dict, before: list[dict], max_restarts: int, held: list[str], needed: int
) -> tuple[str, list[str]]:
    """The supervisor's action for a fault, and the nodes it sets aside. `held`: the job's
    nodes now; `needed`: how many an attempt runs on."""
    if record["kind"] in ("out of memory", "stopped"):  # it would end the same way again
        return f"stopped, not retried: {record['line']}", []
    stop = no_progress(record, before)
    if stop:
        return stop, []
    aside = sorted(implicated(record, before))
    excluded = {n for r in before for n in r.get("excluded", [])} | set(aside)
    usable = [n for n in held if n not in excluded]
    this_allocation = [r for r in before if r.get("allocation") == record["allocation"]]
    restarts = sum(r["action"].startswith("restarted") for r in this_allocation)
    without = f" without {','.join(aside)}" if aside else ""
    if restarts < max_restarts and len(usable) >= needed:
        return f"restarted in the allocation{without}", aside
    why = "no spare node left" if restarts < max_restarts else "cluster.max_restarts reached"
    return f"requeued{without or ''} ({why})", aside


def act_on(
    failures: Path, fault: dict, max_restarts: int, max_requeues: int, held: list[str], needed: int
) -> str:
    """Decide, record and act for the job's supervisor; returns the action."""
    job = os.environ["SLURM_JOB_ID"]
    allocation = int(os.environ.get("SLURM_RESTART_COUNT", 0))
    record = {**fault, "job": job, "job_nodes": needed, "allocation": allocation}
    before = earlier(failures, job)
    action, aside = decide_supervised(record, before, max_restarts, held, needed)
    partition = partition_nodes()
    left = partition - set(aside) - excluded_nodes(failures, job) if partition else None
    if action.startswith("requeued") and allocation >= max_requeues:
        action = f"stopped: {allocation} requeues reached train.max_requeues"
    elif action.startswith("requeued") and left is not None and len(left) < needed:
        action = f"stopped: the partition has fewer than {needed} nodes without those at fault"
    record.update(action=action, excluded=aside)
    with open(failures, "a") as f:  # one short line: a single write, whole
        f.write(json.dumps(record) + "\n")
    quoted = "".join(f"\n    | {line}" for line in record.get("last_lines", []))
    log.get("supervisor").error(f"{record['line']}: {action}{quoted}")
    if action.startswith("requeued"):
        excluded = sorted(excluded_nodes(failures, job))
        if excluded:
            requeue_without(job, excluded)
        else:
            subprocess.run(["scontrol", "requeue", job], capture_output=True, timeout=60)
    return action
