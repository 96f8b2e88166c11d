"""Executors run the steps of a run in order, each behind one interface (base.Executor):

inprocess   in this process, one step after the other (cluster=local, the default)
subprocess  each step its own local processes through submitit (several ranks on CPU)
slurm       every step submitted at once, chained by afterok dependencies
dry_run     prints the graph and the sbatch scripts instead (dry_run=true)
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.orchestration.executors.base import Executor
from pipeline.orchestration.executors.dry_run import DryRunExecutor
from pipeline.orchestration.executors.inprocess import InProcessExecutor
from pipeline.orchestration.executors.slurm import SlurmExecutor
from pipeline.orchestration.executors.subprocesses import SubprocessExecutor

EXECUTORS: dict[str, type[Executor]] = {
    e.name: e for e in (InProcessExecutor, SubprocessExecutor, SlurmExecutor)
}


def select(cfg: PipelineConfig) -> Executor:
    """The executor cluster.executor names, or the dry run when dry_run=true."""
    if cfg.dry_run:
        return DryRunExecutor(cfg.cluster.executor)
    return EXECUTORS[cfg.cluster.executor]()
