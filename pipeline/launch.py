"""Running the job graph: in this process, in local subprocesses (submitit's local executor),
or on Slurm. The only module that talks to submitit."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import time

from omegaconf import DictConfig

from pipeline.graph import Step
from pipeline.layout import RunLayout


def _say(text: str) -> None:
    print(f"[pipeline] {text}", file=sys.stderr, flush=True)


def _local_workers(cfg: DictConfig, tasks: int) -> int:
    return max(1, min(tasks, (os.cpu_count() or 1) // max(1, cfg.cluster.cpus_per_task)))


def _run_array_inprocess(step: Step, cfg: DictConfig) -> None:
    workers = _local_workers(cfg, step.array)
    if workers == 1:
        for index in range(step.array):
            step.run(cfg, index)
        return
    context = multiprocessing.get_context("spawn")  # no fork after torch and threads exist
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for future in [pool.submit(step.run, cfg, i) for i in range(step.array)]:
            future.result()


def run_inprocess(steps: list[Step], cfg: DictConfig) -> None:
    for step in steps:
        started = time.time()
        _say(f"{step.name}: running" + (f" ({step.array} tasks)" if step.array else ""))
        if step.array:
            _run_array_inprocess(step, cfg)
        else:
            if step.ranks > 1:
                raise ValueError(
                    f"{step.name} needs {step.ranks} processes: use cluster.executor=subprocess "
                    "or cluster=slurm"
                )
            step.run(cfg)
        _say(f"{step.name}: done in {time.time() - started:.1f} s")


def _local_executor(cfg: DictConfig, step: Step):
    import submitit

    folder = RunLayout.of(cfg.workdir).logs / "jobs" / step.name / "%j"
    executor = submitit.LocalExecutor(folder=str(folder))
    executor.update_parameters(
        timeout_min=24 * 60,
        tasks_per_node=step.ranks,
        gpus_per_node=cfg.cluster.gpus_per_node if step.uses_gpus else 0,
    )
    return executor


def run_subprocess(steps: list[Step], cfg: DictConfig) -> None:
    """Each step as its own job of submitit's local executor, one after the other."""
    from pipeline import jobs

    for step in steps:
        started = time.time()
        executor = _local_executor(cfg, step)
        if step.array:
            executor.update_parameters(tasks_per_node=1)
            submitted = executor.map_array(jobs.ArrayTask(step.run, cfg), range(step.array))
        else:
            submitted = [executor.submit(jobs.DistributedTask(step.run, cfg))]
        _say(f"{step.name}: {len(submitted)} job(s), logs under {submitted[0].paths.folder}")
        for job in submitted:
            job.results()
        _say(f"{step.name}: done in {time.time() - started:.1f} s")


def run(steps: list[Step], cfg: DictConfig) -> None:
    if cfg.cluster.executor == "inprocess":
        run_inprocess(steps, cfg)
    elif cfg.cluster.executor == "subprocess":
        run_subprocess(steps, cfg)
    else:
        raise ValueError(f"cluster.executor={cfg.cluster.executor} is not supported here yet")
