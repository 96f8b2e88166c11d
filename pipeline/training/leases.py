"""A checkpoint being scored on the downstream tasks while training goes on holds a lease: a
file in its folder naming the job that reads it, so that train.keep_last does not delete the
checkpoint under the job. The scoring job removes it when it is done; a lease whose job is gone
(killed, failed, its node lost) is stale, and retention deletes the checkpoint as usual.

The lease names a process (pid on a host) and, once the job is submitted to Slurm, its job id:
a job id is alive while Slurm says it is queued or running; a pid is alive while it runs on
this host. A lease of another host's process without a job id (one submitting a Slurm job,
seen from a training requeued onto another node) cannot be checked from here: it is honoured
for SUBMITTING_S, far longer than a submission takes."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from pipeline.core import files
from pipeline.resilience import scheduler

LEASE = "SCORING.json"
SUBMITTING_S = 600
# Slurm states of a job that has not ended
ALIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING"}


def take(folder: Path, pid: int, job: str | None = None) -> None:
    """Lease `folder` to the process `pid` on this host (and Slurm job `job`)."""
    record = {"pid": pid, "host": socket.gethostname(), "job": job, "since": time.time()}
    files.write_json(folder / LEASE, record)


def name_job(folder: Path, job: str) -> None:
    """The Slurm job the lease's process submitted: it holds the lease from now on."""
    record = files.read_json_or_none(folder / LEASE) or {"pid": None, "host": None}
    files.write_json(folder / LEASE, {**record, "job": job})


def release(folder: Path) -> None:
    (folder / LEASE).unlink(missing_ok=True)


def holder(folder: Path) -> dict | None:
    """The lease's record when its job is alive, else None (no lease, or a stale one)."""
    try:
        record = files.read_json_or_none(folder / LEASE)
    except ValueError:  # a damaged lease: its job cannot be named, so none holds it
        return None
    if record is None:
        return None
    return record if _alive(record) else None


def _alive(record: dict) -> bool:
    job = record.get("job")
    if job:
        accounted, queued = scheduler.job_states(str(job))
        states = [line.split("|")[1].split()[0] for line in (accounted + queued).splitlines()]
        if not states:  # unknown to Slurm: gone, unless Slurm did not answer
            return scheduler.problem() is not None
        return any(state in ALIVE for state in states)
    if record.get("host") != socket.gethostname():  # another host's process, submitting
        return time.time() - float(record.get("since") or 0) < SUBMITTING_S
    return _pid_alive(record.get("pid"))


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A child that ended and was not waited for still has a pid: it is not scoring."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
