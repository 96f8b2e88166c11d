"""Every call to Slurm's commands outside submitit's submission (pipeline.orchestration.executors
.slurm): requeue, node exclusion, node and job state. Each asks once, with a timeout, and says
"not known" (None, empty) rather than raising when Slurm does not answer; the callers decide
what not knowing means.
"""

from __future__ import annotations

import shutil
import signal
import subprocess

from pipeline.core import log

_log = log.get("supervisor")
TIMEOUT_S = 60


def _run(*command: str, timeout: float = TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, **kwargs)


def _answer(*command: str, timeout: float = TIMEOUT_S) -> str | None:
    """The command's output, or None when it failed or did not answer in time."""
    try:
        done = _run(*command, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def problem() -> str | None:
    """Why jobs cannot be submitted from here, or None when sbatch is installed and a Slurm
    controller answers (installed alone is not enough)."""
    if not shutil.which("sbatch"):
        return "sbatch is not on PATH here"
    try:
        probe = _run("sinfo", "-h", "-o", "%P", timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return "sinfo did not answer within 15 s"
    if probe.returncode != 0:
        said = probe.stderr.strip().splitlines()
        return f"no Slurm controller answers ({said[-1] if said else 'sinfo failed'})"
    return None


def node_table(format: str) -> str | None:
    """`sinfo -h -N -o FORMAT`: a line a node and partition; None: not known."""
    return _answer("sinfo", "-h", "-N", "-o", format, timeout=30)


def down(nodes: list[str]) -> set[str]:
    """Those of `nodes` Slurm holds down or failing."""
    shown = _answer("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t") or ""
    pairs = [line.split() for line in shown.splitlines() if len(line.split()) == 2]
    return {n for n, state in pairs if state.rstrip("*~#!%$@^-").startswith(("down", "fail"))}


def partition_nodes(partition: str | None) -> set[str] | None:
    """The nodes of `partition` that are up; None: not known."""
    if not partition:
        return None
    shown = _answer("sinfo", "-h", "-N", "-p", partition, "-t", "idle,alloc,mix", "-o", "%N")
    return set(shown.split()) if shown is not None else None


def job_nodes(job: str, fallback: str = "") -> list[str]:
    """The nodes job `job` holds now (one lost under --no-kill has left it), in Slurm's order;
    `fallback`: the node list to expand when squeue does not say."""
    listed = (_answer("squeue", "-h", "-j", job, "-o", "%N") or "").strip() or fallback
    return (_answer("scontrol", "show", "hostnames", listed) or "").split()


def show_node(node: str) -> subprocess.CompletedProcess:
    """`scontrol show node NODE`; raises OSError or TimeoutExpired when it cannot run."""
    return _run("scontrol", "show", "node", node)


def job_states(ids: str) -> tuple[str, str]:
    """sacct's `JobID|State|Reason` lines and squeue's `%i|%T|%r` lines for the jobs `ids`
    (comma-separated); empty where one did not answer."""
    accounted = _answer(
        "sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,State,Reason", timeout=30
    )
    queued = _answer("squeue", "-h", "-j", ids, "-o", "%i|%T|%r", timeout=30)
    return accounted or "", queued or ""


def _outlive_the_requeue() -> None:
    """The requeue signals every process of the job: the commands that follow it must run."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def requeue(job: str) -> bool:
    """Job `job` back in the queue (Slurm restarts it under the same id); whether it is."""
    try:
        done = _run("scontrol", "requeue", job)
    except (OSError, subprocess.TimeoutExpired) as e:
        _log.error(f"scontrol requeue {job}: {e}")
        return False
    if done.returncode != 0:
        _log.error(f"scontrol requeue {job}: {done.stderr.strip() or done.returncode}")
    return done.returncode == 0


def requeue_without(job: str, nodes: list[str]) -> None:
    """Back in the queue, never again on `nodes`: held as it is requeued, so that it cannot
    start before its excluded nodes are set (Slurm changes them only on a pending job)."""
    for args in (
        ["requeuehold", job],
        ["update", f"JobId={job}", f"ExcNodeList={','.join(nodes)}"],
        ["release", job],
    ):
        done = _run("scontrol", *args, preexec_fn=_outlive_the_requeue)
        if done.returncode != 0:
            _log.error(f"scontrol {' '.join(args)}: {done.stderr.strip() or done.returncode}")
