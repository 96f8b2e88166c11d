"""The callables a job runs: they turn the job's environment into the standard torch.distributed
variables, then call a step. Picklable, so submitit can ship them to the job."""

from __future__ import annotations

import os
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.errors import StageError
from pipeline.core.steps import Placement
from pipeline.orchestration import rendezvous
from pipeline.orchestration.graph import ArrayStep, Step
from pipeline.resilience import guard
from pipeline.runtime import distributed
from pipeline.training import signals

_log = log.get()


def export_distributed_env(rendezvous_timeout_s: float) -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK from submitit's job environment; MASTER_ADDR an address of
    the first node and MASTER_PORT a port of the job (pipeline.orchestration.rendezvous), unless
    set; how long a rank waits for the others at it."""
    import submitit

    env = submitit.JobEnvironment()
    if env.num_tasks > 1:
        exported = submitit.helpers.TorchDistributedEnvironment()
        if "MASTER_ADDR" not in os.environ:  # a site's own setting wins
            exported.master_addr = rendezvous.address_of(exported.master_addr)
        if "MASTER_PORT" not in os.environ:
            attempt = os.environ.get(guard.ATTEMPT_ENV)  # its own port: the last one's may linger
            exported.master_port = rendezvous.port_of(f"{env.job_id}.{attempt or ''}")
        exported.export(set_cuda_visible_devices=False)
        os.environ[distributed.RENDEZVOUS_TIMEOUT_ENV] = str(rendezvous_timeout_s)


def share_cpu_threads() -> None:
    """Ranks of one node share its CPUs: without this each would start a thread per core."""
    import submitit
    import torch

    if torch.cuda.is_available():
        return
    env = submitit.JobEnvironment()
    per_node = max(1, env.num_tasks // max(1, env.num_nodes))
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // per_node))


def requeuing_job() -> str | None:
    """The Slurm job this process requeues when its step saved and stopped before the time
    limit: the job's, from its first rank alone; None elsewhere."""
    import submitit

    env = submitit.JobEnvironment()
    return env.job_id if env.cluster == "slurm" and env.global_rank == 0 else None


class DistributedTask:
    """A step run by every task of a job (one, or every training rank)."""

    def __init__(self, step: Step, cfg: PipelineConfig):
        self.step, self.cfg = step, cfg

    def __call__(self) -> Any:
        training = self.step.placement is Placement.TRAINING_RANKS
        if training:
            signals.listen()  # before seconds of imports: the warning may come that early
        try:
            export_distributed_env(self.cfg.cluster.rendezvous_timeout_s)
            if training:
                settings = guard.GuardSettings.of(self.cfg)
                return guard.training_rank(settings, self._run, requeues=requeuing_job())
            return self._run()
        except StageError as e:  # the job's log says why in one line, above the trace
            _log.error(f"error: {e}")
            raise

    def _run(self) -> Any:
        share_cpu_threads()
        return self.step.run(self.cfg)


class ArrayTask:
    """One task of an array step, called with its index."""

    def __init__(self, step: ArrayStep, cfg: PipelineConfig):
        self.step, self.cfg = step, cfg

    def __call__(self, index: int) -> Any:
        os.environ.setdefault("OMP_NUM_THREADS", str(self.cfg.cluster.cpus_per_task))
        return self.step.run_task(self.cfg, index)


class ScoreTask:
    """The job that scores one checkpoint on the downstream tasks while training goes on (the
    downstream step's ranks: tensor-parallel groups, data-parallel between them)."""

    def __init__(self, cfg: PipelineConfig, folder: str):
        self.cfg, self.folder = cfg, folder

    def __call__(self) -> dict:
        from pathlib import Path

        from pipeline.evaluation.checkpoint_scoring import score  # torch: imported by the job

        try:
            export_distributed_env(self.cfg.cluster.rendezvous_timeout_s)
            share_cpu_threads()
            return score(self.cfg, Path(self.folder))
        except StageError as e:  # the job's log says why in one line, above the trace
            _log.error(f"error: {e}")
            raise
