"""cluster.executor=inprocess: every step in this process, one after the other (easy to debug);
an array's tasks in a few local processes."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time

from pipeline.config import PipelineConfig
from pipeline.core import interrupts, log
from pipeline.core.steps import Placement
from pipeline.orchestration.executors.base import (
    failures_recorded,
    resources,
    stop_if_interrupted,
)
from pipeline.orchestration.graph import ArrayStep, Step

_log = log.get("pipeline")


def _workers(cfg: PipelineConfig, tasks: int) -> int:
    return max(1, min(tasks, (os.cpu_count() or 1) // max(1, cfg.cluster.cpus_per_task)))


def _run_array(step: ArrayStep, cfg: PipelineConfig, tasks: int) -> None:
    workers = _workers(cfg, tasks)
    if workers == 1:
        for index in range(tasks):
            interrupts.check()
            step.run_task(cfg, index)
        return
    context = multiprocessing.get_context("spawn")  # no fork after torch and threads exist
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for future in [pool.submit(step.run_task, cfg, i) for i in range(tasks)]:
            future.result()
            interrupts.check()


class InProcessExecutor:
    name = "inprocess"

    def run(self, steps: list[Step], cfg: PipelineConfig) -> None:
        for step in steps:
            interrupts.check()  # a Ctrl-C that something swallowed stops before the next step
            with failures_recorded(step, cfg):
                self._run(step, cfg)

    def _run(self, step: Step, cfg: PipelineConfig) -> None:
        started = time.time()
        if step.placement is Placement.ARRAY:
            tasks = step.tasks(cfg)
            _log.info(f"{step.name}: running ({tasks} tasks)")
            _run_array(step, cfg, tasks)
        else:
            _log.info(f"{step.name}: running")
            ranks = resources(step, cfg).ranks
            if ranks > 1:
                raise ValueError(
                    f"{step.name} needs {ranks} processes: use cluster.executor=subprocess "
                    "or cluster=slurm"
                )
            stop_if_interrupted(step, step.run(cfg))
        _log.info(f"{step.name}: done in {time.time() - started:.1f} s")
