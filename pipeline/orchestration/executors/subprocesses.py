"""cluster.executor=subprocess: each step its own job of submitit's local executor (its own
processes, one per task or training rank, gloo between them), one after the other."""

from __future__ import annotations

import time

from pipeline.config import PipelineConfig
from pipeline.core.errors import StageError
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Placement
from pipeline.orchestration.executors.base import (
    failures_recorded,
    resources,
    say,
    stop_if_interrupted,
)
from pipeline.orchestration.graph import Step
from pipeline.orchestration.tasks import ArrayTask, DistributedTask


def _results(step: Step, job) -> list:
    """A local job's results; a failed job is reported in one line: its error, and its log."""
    from submitit.core.utils import FailedJobError

    try:
        return job.results()
    except FailedJobError as e:
        parts = str(e).split("-" * 22)  # submitit quotes the job's traceback between rules
        last = parts[1].strip().splitlines()[-1] if len(parts) > 2 else str(e).splitlines()[0]
        raise StageError(f"{step.name} failed: {last} (log: {job.paths.stderr})") from None


class SubprocessExecutor:
    name = "subprocess"

    def run(self, steps: list[Step], cfg: PipelineConfig) -> None:
        import submitit

        paths = RunPaths.of(cfg.workdir)
        for step in steps:
            started = time.time()
            needs = resources(step, cfg)
            executor = submitit.LocalExecutor(folder=str(paths.job_logs(step.name)))
            executor.update_parameters(
                timeout_min=24 * 60, tasks_per_node=needs.ranks, gpus_per_node=needs.gpus_per_node
            )
            if step.placement is Placement.ARRAY:
                executor.update_parameters(tasks_per_node=1)
                tasks = range(step.tasks(cfg))
                submitted = executor.map_array(ArrayTask(step, cfg), tasks)
            else:
                submitted = [executor.submit(DistributedTask(step, cfg))]
            say(f"{step.name}: {len(submitted)} job(s), logs under {submitted[0].paths.folder}")
            with failures_recorded(step, cfg):
                for job in submitted:
                    stop_if_interrupted(step, _results(step, job)[0])
            say(f"{step.name}: done in {time.time() - started:.1f} s")
