"""While training goes on, every eval.harness_every-th checkpoint kept is scored on the
downstream tasks by a job of its own: `python -m pipeline.score`, started detached (a session
of its own, its output in logs/jobs/downstream/<checkpoint>.log), which scores it here or, on
Slurm, submits the job that does. Training never waits for the scoring; the checkpoint holds a
lease (pipeline.training.leases) until its job is done, so train.keep_last leaves it alone.
The last checkpoint is left to the downstream step after training."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.training import leases
from pipeline.training.retention import folder_name

_log = log.get()
SUBMISSION_WAIT_S = 120  # what the end of a Slurm training waits for its last submissions


def due(cfg: PipelineConfig, step: int) -> bool:
    """A checkpoint of `step` is scored now: a regular save (not one for a stop signal), every
    eval.harness_every-th, before the last step."""
    e, t = cfg.eval, cfg.train
    if not e.harness_tasks or e.harness_every <= 0 or t.save_interval <= 0 or step >= t.steps:
        return False
    return step % t.save_interval == 0 and (step // t.save_interval) % e.harness_every == 0


# what a training rank's environment holds of its own job: the scoring job is another
TRAINING_ONLY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
TRAINING_ONLY += ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
JOB_PREFIXES = ("SLURM_", "SUBMITIT_", "PMI_", "OMPI_")
SITE = {"SLURM_CONF"}  # where Slurm's configuration is: the cluster's, not the job's


def job_environment(environ: dict[str, str]) -> dict[str, str]:
    """The scoring process's environment: the training's, less what places it in the
    training's job (its rank and rendezvous, the Slurm job), with this package importable."""
    env = {
        k: v
        for k, v in environ.items()
        if k in SITE or (k not in TRAINING_ONLY and not k.startswith(JOB_PREFIXES))
    }
    package_root = str(Path(__file__).resolve().parents[2])  # where `pipeline` is
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


class ScoringJobs:
    """The scoring jobs one training process starts (the first rank's)."""

    def __init__(self, cfg: PipelineConfig, starts: bool) -> None:
        self.cfg, self.starts = cfg, starts
        self.paths = RunPaths.of(cfg.workdir)
        self.started: list[subprocess.Popen] = []

    def saved(self, step: int) -> None:
        """A checkpoint of `step` is complete: start its scoring if it is due."""
        folder = self.paths.checkpoints / folder_name(step)
        if not (self.starts and due(self.cfg, step) and folder.is_dir()):
            return
        logfile = self.paths.downstream_log(folder.name)
        logfile.parent.mkdir(parents=True, exist_ok=True)
        env = job_environment(dict(os.environ))
        command = [sys.executable, "-m", "pipeline.score", str(self.paths.root), folder.name]
        with open(logfile, "ab") as out:
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # not killed with the training's process group
            )
        leases.take(folder, child.pid)
        self.started.append(child)
        _log.info(f"downstream: scoring {folder.name} in pid {child.pid} (log: {logfile})")

    def finish(self) -> None:
        """On Slurm the processes only submit jobs, and the end of the training job would end
        them too: wait for those still submitting. A local one scores, and is not waited for."""
        if self.cfg.cluster.executor != "slurm":
            return
        for child in self.started:
            try:
                child.wait(SUBMISSION_WAIT_S)
            except subprocess.TimeoutExpired:
                _log.warning(f"downstream: pid {child.pid} has not submitted its job yet")
