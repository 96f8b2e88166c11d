"""The callables a job runs: they turn the job's environment into the standard torch.distributed
variables, then call a step. Picklable, so submitit can ship them to the job."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.errors import StageError
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Interrupted, Placement
from pipeline.orchestration import rendezvous
from pipeline.orchestration.graph import ArrayStep, Step
from pipeline.runtime import distributed, faults, progress
from pipeline.training import signals

_log = log.get()
ATTEMPT_ENV = "PIPELINE_ATTEMPT"  # set by the job's supervisor: the attempt the ranks are
SUPERVISED_ENV = "PIPELINE_SUPERVISED"  # the watchdog leaves the decision to the supervisor


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
            attempt = os.environ.get(ATTEMPT_ENV)  # its own port: the last one's may linger
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


class DistributedTask:
    """A step run by every task of a job (one, or every training rank)."""

    def __init__(self, step: Step, cfg: PipelineConfig):
        self.step, self.cfg = step, cfg

    def __call__(self) -> Any:
        if self.step.placement is Placement.TRAINING_RANKS:
            signals.listen()  # before seconds of imports: the warning may come that early
        try:
            export_distributed_env(self.cfg.cluster.rendezvous_timeout_s)
            if self.step.placement is Placement.TRAINING_RANKS:
                watched(self.cfg)
            share_cpu_threads()
            result = self.step.run(self.cfg)
        except Exception as e:
            if self.step.placement is Placement.TRAINING_RANKS:
                record_death(self.cfg, e)
            if isinstance(e, StageError):  # the job's log says why in one line, above the trace
                _log.error(f"error: {e}")
            raise
        if isinstance(result, Interrupted) and result.requeue:
            requeue(self.cfg.train.max_requeues)
        return result


def record_death(cfg: PipelineConfig, error: Exception) -> None:
    """A training rank ending on `error` leaves what, and at which step, for the job's
    supervisor (pipeline.orchestration.supervisor)."""
    step = progress.reported_step()
    if step is not None:
        rank = distributed.from_env().rank
        faults.write_death(RunPaths.of(cfg.workdir).progress, rank, step, error)


# torch's defaults where the job sets none: a failed or timed-out NCCL collective ends the
# process instead of hanging it, and each rank keeps its last collectives (the flight
# recorder), written to train/ on a timeout: which rank was missing from which collective
NCCL_DEFAULTS = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


def watched(cfg: PipelineConfig) -> None:
    """This training rank reports its progress; the node's first rank starts the node's hang
    watchdog (pipeline.runtime.watchdog), a process of its own. cluster.hang_timeout_s=0: off."""
    paths = RunPaths.of(cfg.workdir)
    for name, value in NCCL_DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(paths.train_dir / "nccl_trace_rank_"))
    timeout = cfg.cluster.hang_timeout_s
    if timeout == 0:
        return
    me = distributed.from_env()
    progress.start(paths.progress, me.rank)
    if me.local_rank != 0:
        return
    attempt = os.environ.get(ATTEMPT_ENV) or os.environ.get("SLURM_RESTART_COUNT", "0")
    subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.runtime.watchdog",
            str(cfg.workdir),
            progress.node_name(),
            str(os.getpid()),
            attempt,
            "auto" if timeout is None else str(timeout),
            str(cfg.cluster.max_restarts),
            "supervisor" if SUPERVISED_ENV in os.environ else "self",
        ],
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the job's group is the ranks' to handle
    )


def requeue(max_requeues: int) -> None:
    """The step saved and stopped before its time limit: put the job back in the queue (once,
    from the first rank), up to train.max_requeues times. Slurm restarts it under the same job
    id. Never after SIGTERM: a cancelled job must stay cancelled."""
    import submitit

    env = submitit.JobEnvironment()
    if env.cluster != "slurm" or env.global_rank != 0:
        return
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", 0))
    if restarts >= max_requeues:
        raise RuntimeError(f"not requeued: {restarts} requeues reached train.max_requeues")
    subprocess.run(["scontrol", "requeue", env.job_id], check=True, timeout=60)
    _log.warning(f"requeued job {env.job_id} (restart {restarts + 1})")


class ArrayTask:
    """One task of an array step, called with its index."""

    def __init__(self, step: ArrayStep, cfg: PipelineConfig):
        self.step, self.cfg = step, cfg

    def __call__(self, index: int) -> Any:
        os.environ.setdefault("OMP_NUM_THREADS", str(self.cfg.cluster.cpus_per_task))
        return self.step.run_task(self.cfg, index)
