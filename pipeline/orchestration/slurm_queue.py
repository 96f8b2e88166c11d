"""What Slurm says of the run's jobs: the history of submissions (jobs.json), each job's state
from sacct and squeue, and which steps still have a job queued or running."""

from __future__ import annotations

import time

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.resilience import scheduler

ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING"}
FAILED = {
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def slurm_answers() -> bool:
    """sbatch is installed and a Slurm controller answers (installed alone is not enough)."""
    return slurm_problem() is None


def slurm_problem() -> str | None:
    """Why jobs cannot be submitted from here, or None when sbatch is installed and a Slurm
    controller answers."""
    return scheduler.problem()


def latest_submission(paths: RunPaths) -> dict[str, list[str]]:
    """Job ids by step of the newest submission (array tasks as ID_N); {} if none."""
    history = files.read_json_or_none(paths.jobs) or []
    return history[-1]["jobs"] if history else {}


def record_submission(paths: RunPaths, jobs: dict[str, list[str]]) -> None:
    history = files.read_json_or_none(paths.jobs) or []
    history.append({"submitted": time.strftime("%Y-%m-%dT%H:%M:%S"), "jobs": jobs})
    files.write_json(paths.jobs, history)


def slurm_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """job id -> (state, reason) from sacct, falling back to squeue for jobs sacct lacks."""
    states: dict[str, tuple[str, str]] = {}
    ids = ",".join(sorted({j.split("_")[0] for j in job_ids}))
    accounted, queued = scheduler.job_states(ids)
    for line in accounted.splitlines():
        job, state, *reason = line.split("|")
        states[job] = (state.split()[0], reason[0] if reason else "")
    for line in queued.splitlines():
        job, state, reason = line.split("|")
        states.setdefault(job, (state, reason))
    for job in job_ids:  # array tasks that never started are listed together, as ID_[0-3]
        base = job.split("_")[0] + "_["
        grouped = next((v for k, v in states.items() if k.startswith(base)), None)
        if job not in states and grouped:
            states[job] = grouped
    return states


def active_jobs(paths: RunPaths) -> dict[str, list[str]]:
    """Steps of the latest submission whose jobs are still queued or running."""
    latest = latest_submission(paths)
    if not latest:
        return {}
    states = slurm_states([j for ids in latest.values() for j in ids])
    return {
        step: ids
        for step, ids in latest.items()
        if any(states.get(j, ("", ""))[0] in ACTIVE for j in ids)
    }
