"""A training job's first process under Slurm. It starts the ranks with srun on cluster.nodes
of the job's nodes (cluster.spare_nodes more are held in reserve) and, when an attempt fails,
tells what failed (pipeline.runtime.faults), records it in train/failures.jsonl and acts on
it without giving the allocation back: up to cluster.max_restarts times it starts the ranks
again, from the newest complete checkpoint, a node at fault swapped for a spare. With no
spare left or the restarts spent, the job requeues itself without the nodes at fault.

The ranks of an attempt each run `python -m pipeline.orchestration.rank`, which loads the
pickled DistributedTask this process wrote into the job's log folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.orchestration.graph import Step
from pipeline.orchestration.tasks import ATTEMPT_ENV, SUPERVISED_ENV, DistributedTask
from pipeline.runtime import fault_actions, faults

if TYPE_CHECKING:  # the executors import this module
    from pipeline.orchestration.executors.base import Resources

_log = log.get("supervisor")


def job_nodes(job: str) -> list[str]:
    """The nodes the job holds now (one lost under --no-kill has left it), in Slurm's order."""
    shown = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, timeout=60
    )
    listed = shown.stdout.strip() or os.environ.get("SLURM_JOB_NODELIST", "")
    expanded = subprocess.run(
        ["scontrol", "show", "hostnames", listed], capture_output=True, text=True, timeout=60
    )
    return expanded.stdout.split()


class Supervisor:
    """What the training job's batch script runs (submitit ships it pickled)."""

    def __init__(self, step: Step, cfg: PipelineConfig, needs: Resources):
        self.step, self.cfg, self.needs = step, cfg, needs
        self.stopping = False

    def __call__(self) -> Any:
        job = os.environ["SLURM_JOB_ID"]
        paths = RunPaths.of(self.cfg.workdir)
        folder = Path(str(paths.job_logs(self.step.name)).replace("%j", job))
        task = folder / "ranks.pkl"
        _write_task(task, DistributedTask(self.step, self.cfg))
        # scancel, or the job requeued by its rank 0: the ranks are Slurm's to end, not to restart
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the time-limit warning is the ranks'
        needs = self.needs
        while True:
            attempt = faults.next_attempt(folder / "attempts")
            allocated = job_nodes(job)
            excluded = fault_actions.excluded_nodes(paths.failures_log, job)
            nodes = [n for n in allocated if n not in excluded][: needs.nodes]
            if len(nodes) < needs.nodes:
                _stop(f"{len(nodes)} usable node(s) left in the job for {needs.nodes}")
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
            action = fault_actions.act_on(
                paths.failures_log,
                fault,
                max_restarts=self.cfg.cluster.max_restarts,
                max_requeues=self.cfg.train.max_requeues,
                held=job_nodes(job),
                needed=needs.nodes,
            )
            if action.startswith("requeued"):
                return None
            if action.startswith("stopped"):
                raise SystemExit(1)  # said in one line as the fault was recorded

    def _stop(self, signum, frame) -> None:
        self.stopping = True

    def _srun(
        self, task: Path, folder: Path, nodes: list[str], attempt: int
    ) -> subprocess.CompletedProcess:
        """One attempt: the ranks on `nodes`, each writing its own log; srun's own lines
        (which rank ended how) pass through to this job's log and come back for diagnosis."""
        needs = self.needs
        command = [
            "srun",
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * needs.tasks_per_node}",
            f"--ntasks-per-node={needs.tasks_per_node}",
            f"--nodelist={','.join(nodes)}",
            f"--cpus-per-task={self.cfg.cluster.cpus_per_task}",
            *([f"--gpus-per-node={needs.gpus_per_node}"] if needs.gpus_per_node else []),
            "--kill-on-bad-exit=1",
            "--unbuffered",
            f"--output={folder}/%j_rank%t_log.out",
            f"--error={folder}/%j_rank%t_log.err",
            "--open-mode=append",
            *srun_args(self.cfg),
            sys.executable,
            "-u",
            "-m",
            "pipeline.orchestration.rank",
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


def srun_args(cfg: PipelineConfig) -> list[str]:
    """What the tasks' srun gets beyond submitit's own: the container (pyxis), then the site's."""
    c = cfg.cluster
    args = []
    if c.container_image:
        args.append(f"--container-image={c.container_image}")
    if c.container_mounts:
        args.append(f"--container-mounts={','.join(c.container_mounts)}")
    return [*args, *c.srun_args]


def _stop(line: str) -> None:
    """End the job as failed, in one line (no trace: nothing is wrong with the code)."""
    _log.error(f"error: {line}")
    raise SystemExit(1)


def _write_task(path: Path, task: DistributedTask) -> None:
    import cloudpickle

    from pipeline.core import files

    with files.atomic_path(path) as written:
        written.write_bytes(cloudpickle.dumps(task))
