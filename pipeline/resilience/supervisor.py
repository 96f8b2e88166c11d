"""A training job's first process under Slurm. It starts the ranks with srun on cluster.nodes
of the job's nodes (resilience.spare_nodes more are held in reserve) and, when an attempt fails,
tells what failed (pipeline.resilience.faults), records it in train/failures.jsonl and acts on
it without giving the allocation back (pipeline.resilience.decisions): up to
resilience.max_restarts times it starts the ranks again, from the newest complete checkpoint, a
node at fault swapped for a spare. With no spare left or the restarts spent, the job requeues
itself without the nodes at fault.

The ranks of an attempt each run `python -m pipeline.resilience.rank`, which loads the pickled
task (the step's DistributedTask) this process wrote into the job's log folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.resilience import decisions, faults, records, scheduler
from pipeline.resilience.decisions import Allocation, Limits
from pipeline.resilience.guard import ATTEMPT_ENV, SUPERVISED_ENV
from pipeline.resilience.records import Action

_log = log.get("supervisor")


@dataclass(frozen=True)
class Attempts:
    """How each attempt's ranks are started: on `nodes` nodes of the job, `tasks_per_node`
    each; `srun_args`: the site's and the container's."""

    workdir: str
    logs: str  # the job's log folder, %j for its id
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    srun_args: tuple[str, ...]
    limits: Limits


def job_nodes(job: str) -> list[str]:
    """The nodes the job holds now, in Slurm's order."""
    return scheduler.job_nodes(job, fallback=os.environ.get("SLURM_JOB_NODELIST", ""))


class Supervisor:
    """What the training job's batch script runs (submitit ships it pickled)."""

    def __init__(self, task: Callable[[], Any], attempts: Attempts):
        self.task, self.attempts = task, attempts
        self.stopping = False

    def __call__(self) -> Any:
        job = os.environ["SLURM_JOB_ID"]
        paths, a = RunPaths.of(self.attempts.workdir), self.attempts
        folder = Path(a.logs.replace("%j", job))
        task = folder / "ranks.pkl"
        _write_task(task, self.task)
        # scancel, or the job requeued by its rank 0: the ranks are Slurm's to end, not to restart
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the time-limit warning is the ranks'
        while True:
            attempt = faults.next_attempt(folder / "attempts")
            excluded = decisions.excluded_nodes(records.read(paths.failures_log, job))
            nodes = [n for n in job_nodes(job) if n not in excluded][: a.nodes]
            if len(nodes) < a.nodes:
                _stop(f"{len(nodes)} usable node(s) left in the job for {a.nodes}")
            faults.clear(paths.progress)
            ended = self._srun(task, folder, nodes, attempt)
            if ended.returncode == 0 or self.stopping:
                return None
            fault = faults.diagnose(
                paths,
                ended.stderr,
                nodes,
                job_nodes(job),
                lambda rank: folder / f"{job}_rank{rank}_log.err",
                attempt,
            )
            decision = self.decide(paths, job, fault)
            if decision.action is Action.REQUEUED:
                return None
            if decision.action is Action.STOPPED:
                raise SystemExit(1)  # said in one line as the fault was recorded

    def decide(self, paths: RunPaths, job: str, fault: records.FaultRecord) -> records.Decision:
        """Record `fault` as this job's and act on it."""
        allocation = int(os.environ.get("SLURM_RESTART_COUNT", 0))
        fault.job, fault.job_nodes, fault.allocation = job, self.attempts.nodes, allocation
        where = Allocation(
            needed=self.attempts.nodes,
            held=job_nodes(job),
            partition=scheduler.partition_nodes(os.environ.get("SLURM_JOB_PARTITION")),
            requeues=allocation,
        )
        decision = decisions.act(paths.failures_log, fault, self.attempts.limits, where)
        quoted = "".join(f"\n    | {line}" for line in fault.last_lines or [])
        _log.error(f"{fault.line}: {decision.said}{quoted}")
        return decision

    def _stop(self, signum, frame) -> None:
        self.stopping = True

    def _srun(
        self, task: Path, folder: Path, nodes: list[str], attempt: int
    ) -> subprocess.CompletedProcess:
        """One attempt: the ranks on `nodes`, each writing its own log; srun's own lines
        (which rank ended how) pass through to this job's log and come back for diagnosis."""
        a = self.attempts
        command = [
            "srun",
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * a.tasks_per_node}",
            f"--ntasks-per-node={a.tasks_per_node}",
            f"--nodelist={','.join(nodes)}",
            f"--cpus-per-task={a.cpus_per_task}",
            *([f"--gpus-per-node={a.gpus_per_node}"] if a.gpus_per_node else []),
            "--kill-on-bad-exit=1",
            "--unbuffered",
            f"--output={folder}/%j_rank%t_log.out",
            f"--error={folder}/%j_rank%t_log.err",
            "--open-mode=append",
            *a.srun_args,
            sys.executable,
            "-u",
            "-m",
            "pipeline.resilience.rank",
            str(task),
        ]
        env = {**os.environ, ATTEMPT_ENV: str(attempt), SUPERVISED_ENV: "1"}
        _log.info(f"attempt {attempt}: {len(nodes)} node(s): {','.join(nodes)}")
        running = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        lines = []
        for line in running.stderr:  # srun's own: a few lines, as ranks end
            sys.stderr.write(line)
            lines.append(line)
        return subprocess.CompletedProcess(command, running.wait(), "", "".join(lines))


def _stop(line: str) -> None:
    """End the job as failed, in one line (no trace: nothing is wrong with the code)."""
    _log.error(f"error: {line}")
    raise SystemExit(1)


def _write_task(path: Path, task: Callable[[], Any]) -> None:
    import cloudpickle

    from pipeline.core import files

    with files.atomic_path(path) as written:
        written.write_bytes(cloudpickle.dumps(task))
