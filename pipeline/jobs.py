"""The callables a scheduler runs: they turn the job's environment into the standard
torch.distributed variables, then call a stage. Picklable, so submitit can ship them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig


def export_distributed_env() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT from submitit's job environment."""
    import submitit

    env = submitit.JobEnvironment()
    if env.num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


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
    def __init__(self, fn: Callable[[DictConfig], Any], cfg: DictConfig):
        self.fn, self.cfg = fn, cfg

    def __call__(self) -> Any:
        export_distributed_env()
        share_cpu_threads()
        result = self.fn(self.cfg)
        if isinstance(result, dict) and result.get("requeue"):
            requeue(self.cfg)
        return result


def requeue(cfg: DictConfig) -> None:
    """The stage saved and stopped before its time limit: put the job back in the queue (once,
    from the first rank), up to train.max_requeues times. Slurm restarts it under the same job
    id. Never after SIGTERM: a cancelled job must stay cancelled."""
    import submitit

    env = submitit.JobEnvironment()
    if env.cluster != "slurm" or env.global_rank != 0:
        return
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", 0))
    if restarts >= cfg.train.max_requeues:
        raise RuntimeError(f"not requeued: {restarts} requeues reached train.max_requeues")
    subprocess.run(["scontrol", "requeue", env.job_id], check=True, timeout=60)
    print(f"requeued job {env.job_id} (restart {restarts + 1})", file=sys.stderr, flush=True)


class ArrayTask:
    def __init__(self, fn: Callable[[DictConfig, int], Any], cfg: DictConfig):
        self.fn, self.cfg = fn, cfg

    def __call__(self, index: int) -> Any:
        os.environ.setdefault("OMP_NUM_THREADS", str(self.cfg.cluster.cpus_per_task))
        return self.fn(self.cfg, index)
