"""cluster.executor=subprocess: each step its own job of submitit's local executor (its own
processes, one per task or training rank, gloo between them), one after the other."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core import interrupts, log
from pipeline.core.errors import StageError
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Placement
from pipeline.orchestration.executors.base import (
    failures_recorded,
    resources,
    stop_if_interrupted,
)
from pipeline.orchestration.graph import Step
from pipeline.orchestration.tasks import ArrayTask, DistributedTask, ScoreTask

_log = log.get("pipeline")


def _results(step: Step, job, failures: Path, since: float) -> list:
    """A local job's results; a failed job is reported in one line: its error, and its log; or
    the fault its ranks' watchdog recorded, which killed them without a traceback."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        return job.results()
    except (FailedJobError, UncompletedJobError) as e:
        parts = str(e).split("-" * 22)  # submitit quotes the job's traceback between rules
        last = parts[1].strip().splitlines()[-1] if len(parts) > 2 else str(e).splitlines()[0]
        last = _fault_since(failures, since) or last
        raise StageError(f"{step.name} failed: {last} (log: {job.paths.stderr})") from None


def _fault_since(failures: Path, since: float) -> str | None:
    """The line of the last fault recorded in train/failures.jsonl after `since`, if any."""
    try:
        lines = failures.read_text().splitlines()
    except OSError:
        return None
    last = json.loads(lines[-1]) if lines else {}
    at = time.mktime(time.strptime(last["time"], "%Y-%m-%dT%H:%M:%S")) if last else 0
    return last.get("line") if at >= int(since) else None


def _log_of_last_rank(job, ranks: int) -> Path:
    from submitit.core.utils import JobPaths

    return JobPaths(job.paths.folder, job_id=job.job_id, task_id=ranks - 1).stderr


_TRACEBACK = "Traceback (most recent call last)"
_STACKS = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_CHAINED = ("During handling of the above exception", "The above exception was the direct")
_PROCESS_HEADER = re.compile(r"^Process [\w-]+:$")  # multiprocessing's, above a child's trace
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")  # torch.distributed's, on a rank's trace lines


class ConsoleLines:
    """Which lines of a rank's log the console gets: all but tracebacks (a checkpoint writer's,
    say, when a save fails and training goes on) and stack dumps (the hang watchdog's), which
    stay in the log. A traceback runs to its exception line, chained ones included; a stack
    dump to its last frame."""

    def __init__(self) -> None:
        self.state = "text"  # or "frames" (a traceback's), "after" (its exception line), "stacks"
        self.held: str | None = None  # a line that may open a trace

    def __call__(self, line: str) -> list[str]:
        text = _RANK_PREFIX.sub("", line.rstrip("\n"), count=1)
        held, self.held = self.held, None
        if text.startswith(_TRACEBACK) or _STACKS.match(text):
            self.state = "frames" if text.startswith(_TRACEBACK) else "stacks"
            return []
        indented_or_blank = not text.strip() or text.startswith((" ", "\t"))
        if self.state in ("frames", "stacks") and indented_or_blank:
            return []
        if self.state == "frames":  # its exception line
            self.state = "after"
            return []
        if self.state == "after" and (not text.strip() or text.startswith(_CHAINED)):
            return []
        self.state = "text"
        if _PROCESS_HEADER.match(text):
            self.held = line
            return [held] if held is not None else []
        return [held, line] if held is not None else [line]


@contextlib.contextmanager
def _followed(log: Path | None, every_s: float = 1.0) -> Iterator[None]:
    """The log's whole lines echoed on this process's stderr as they are written (a training
    job's steps, validations and saves), its traces and stacks left out (ConsoleLines): a
    failed job is reported in one line naming its log."""
    if log is None:
        yield
        return
    done = threading.Event()

    def follow() -> None:
        offset, console = 0, ConsoleLines()
        while True:
            finished = done.wait(every_s)
            if log.exists():
                with open(log, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                whole = chunk.rfind(b"\n") + 1
                offset += whole
                for line in chunk[:whole].decode(errors="replace").splitlines(keepends=True):
                    sys.stderr.writelines(console(line))
                sys.stderr.flush()
            if finished:
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class SubprocessExecutor:
    name = "subprocess"

    def run(self, steps: list[Step], cfg: PipelineConfig) -> None:
        import submitit

        paths = RunPaths.of(cfg.workdir)
        for step in steps:
            interrupts.check()  # a Ctrl-C that something swallowed stops before the next step
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
            _log.info(
                f"{step.name}: {len(submitted)} job(s), logs under {submitted[0].paths.folder}"
            )
            # an array's tasks each end with a line of their own; a training job's last rank,
            # which logs the steps (it holds the loss), is followed
            shown = _log_of_last_rank(submitted[0], needs.ranks) if len(submitted) == 1 else None
            with failures_recorded(step, cfg), _followed(shown):
                for job in submitted:
                    results = _results(step, job, paths.failures_log, started)
                    stop_if_interrupted(step, results[0])
            _log.info(f"{step.name}: done in {time.time() - started:.1f} s")


def score_in_ranks(cfg: PipelineConfig, folder: Path) -> None:
    """Score the checkpoint `folder` in a job of the downstream step's ranks on this machine
    (submitit's local executor; gloo between CPU ranks), waiting for it to end."""
    import submitit

    from pipeline.evaluation.downstream_step import DOWNSTREAM

    paths = RunPaths.of(cfg.workdir)
    started = time.time()
    needs = resources(DOWNSTREAM, cfg)
    executor = submitit.LocalExecutor(folder=str(paths.job_logs(f"downstream-{folder.name}")))
    executor.update_parameters(
        timeout_min=24 * 60, tasks_per_node=needs.ranks, gpus_per_node=needs.gpus_per_node
    )
    job = executor.submit(ScoreTask(cfg, str(folder)))
    _log.info(f"downstream {folder.name}: {needs.ranks} ranks, logs under {job.paths.folder}")
    _results(DOWNSTREAM, job, paths.failures_log, started)
    _log.info(f"downstream {folder.name}: scored ({paths.downstream_result(folder.name)})")
