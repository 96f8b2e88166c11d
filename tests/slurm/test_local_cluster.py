"""The local cluster runs arrays and dependencies, and sacct reports their states."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

TERMINAL_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}


def _sbatch(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        ["sbatch", "--parsable", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # --parsable prints "jobid" or "jobid;cluster".
    return result.stdout.strip().split(";")[0]


def _sacct(job_id: str) -> dict[str, dict[str, str]]:
    """Allocation rows of a job (array tasks as JOBID_N), keyed by job id."""
    result = subprocess.run(
        ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,Start,End"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        return {}
    rows = {}
    for line in result.stdout.splitlines():
        if not line.strip():
            continue
        jid, state, start, end = line.split("|")
        # "CANCELLED by 0" -> "CANCELLED"
        rows[jid] = {"state": state.split()[0], "start": start, "end": end}
    return rows


def _wait_finished(job_id: str, n_rows: int, timeout_s: float = 120.0) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + timeout_s
    rows: dict[str, dict[str, str]] = {}
    while time.monotonic() < deadline:
        rows = _sacct(job_id)
        if len(rows) == n_rows and all(r["state"] in TERMINAL_STATES for r in rows.values()):
            return rows
        time.sleep(1)
    pytest.fail(f"job {job_id} did not finish within {timeout_s}s; sacct: {rows}")


def test_array_then_dependent_job_complete(slurm_cluster, tmp_path: Path) -> None:
    array_id = _sbatch(
        "--array=0-1",
        f"--output={tmp_path}/array-%A_%a.out",
        "--wrap=echo task $SLURM_ARRAY_TASK_ID",
        cwd=tmp_path,
    )
    dep_id = _sbatch(
        f"--dependency=afterok:{array_id}",
        f"--output={tmp_path}/dep-%j.out",
        "--wrap=echo dependent",
        cwd=tmp_path,
    )

    array_rows = _wait_finished(array_id, n_rows=2)
    dep_rows = _wait_finished(dep_id, n_rows=1)

    assert sorted(array_rows) == [f"{array_id}_0", f"{array_id}_1"]
    assert {r["state"] for r in array_rows.values()} == {"COMPLETED"}
    assert dep_rows[dep_id]["state"] == "COMPLETED"
    # afterok: the dependent job started only once every array task had ended.
    assert dep_rows[dep_id]["start"] >= max(r["end"] for r in array_rows.values())
    for task in (0, 1):
        out = tmp_path / f"array-{array_id}_{task}.out"
        assert out.read_text().strip() == f"task {task}"
    assert (tmp_path / f"dep-{dep_id}.out").read_text().strip() == "dependent"
