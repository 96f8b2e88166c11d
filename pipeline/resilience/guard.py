"""The fault plumbing of one training rank, around its step: NCCL's error handling on, progress
reported for the hang watchdog (pipeline.resilience.watchdog, which the node's first rank
starts), the rank's death recorded for the job's supervisor, and the job requeued when the step
saved and stopped before its time limit."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Interrupted
from pipeline.resilience import faults, progress, scheduler
from pipeline.resilience.watchdog import WatchdogSettings
from pipeline.runtime import distributed, placement

_log = log.get()
ATTEMPT_ENV = "PIPELINE_ATTEMPT"  # set by the job's supervisor: the attempt the ranks are
SUPERVISED_ENV = "PIPELINE_SUPERVISED"  # the watchdog leaves the decision to the supervisor

# torch's defaults where the job sets none: a failed or timed-out NCCL collective ends the
# process instead of hanging it, and each rank keeps its last collectives (the flight
# recorder), written to train/ on a timeout: which rank was missing from which collective
NCCL_DEFAULTS = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


@dataclass(frozen=True)
class GuardSettings:
    workdir: str
    hang_timeout_s: float | None  # 0: no watchdog; None: derived from the steps
    max_restarts: int
    max_requeues: int

    @classmethod
    def of(cls, cfg: PipelineConfig) -> GuardSettings:
        r = cfg.resilience
        return cls(str(cfg.workdir), r.hang_timeout_s, r.max_restarts, r.max_requeues)


def training_rank(settings: GuardSettings, step: Callable[[], Any], requeues: str | None) -> Any:
    """Run `step` as a training rank: watched, its death recorded. `requeues`: the Slurm job
    this rank requeues when the step asks (the job's first rank's), else None."""
    watched(settings)
    try:
        result = step()
    except Exception as e:
        record_death(settings, e)
        raise
    if isinstance(result, Interrupted) and result.requeue and requeues is not None:
        requeue(requeues, settings.max_requeues)
    return result


def watched(settings: GuardSettings) -> None:
    """This training rank reports its progress; the node's first rank starts the node's hang
    watchdog, a process of its own. resilience.hang_timeout_s=0: off."""
    paths = RunPaths.of(settings.workdir)
    for name, value in NCCL_DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(paths.train_dir / "nccl_trace_rank_"))
    if settings.hang_timeout_s == 0:
        return
    me = distributed.from_env()
    progress.start(paths.progress, me.rank)
    if me.local_rank != 0:
        return
    attempt = os.environ.get(ATTEMPT_ENV) or os.environ.get("SLURM_RESTART_COUNT", "0")
    watchdog = WatchdogSettings(
        workdir=settings.workdir,
        node=placement.node_name(),
        parent_pid=os.getpid(),
        attempt=int(attempt),
        timeout_s=settings.hang_timeout_s,
        supervised=SUPERVISED_ENV in os.environ,
        max_restarts=settings.max_restarts,
        max_requeues=settings.max_requeues,
        job=os.environ.get("SLURM_JOB_ID"),
        job_nodes=int(os.environ.get("SLURM_JOB_NUM_NODES", 1)),
        partition=os.environ.get("SLURM_JOB_PARTITION"),
    )
    subprocess.Popen(
        watchdog.to_argv(),
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the job's group is the ranks' to handle
    )


def record_death(settings: GuardSettings, error: Exception) -> None:
    """A training rank ending on `error` leaves what, and at which step, for the job's
    supervisor (pipeline.resilience.supervisor)."""
    step = progress.reported_step()
    if step is not None:
        rank = distributed.from_env().rank
        faults.write_death(RunPaths.of(settings.workdir).progress, rank, step, error)


def requeue(job: str, max_requeues: int) -> None:
    """The step saved and stopped before its time limit: put the job back in the queue, up to
    resilience.max_requeues times. Slurm restarts it under the same job id. Never after SIGTERM: a
    cancelled job must stay cancelled."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", 0))
    if restarts >= max_requeues:
        raise RuntimeError(f"not requeued: {restarts} requeues reached resilience.max_requeues")
    if not scheduler.requeue(job):
        raise RuntimeError(f"not requeued: scontrol requeue {job} failed")
    _log.warning(f"requeued job {job} (restart {restarts + 1})")
