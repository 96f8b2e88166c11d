"""What every executor shares: the interface, the resources a step's placement asks for on
this cluster, and how an interrupted step ends the chain."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.config import PipelineConfig
from pipeline.config.derived import settled, tasks_per_node
from pipeline.core import files
from pipeline.core.errors import StageError
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Interrupted, Placement
from pipeline.orchestration.graph import Step


class Executor(Protocol):
    name: str

    def run(self, steps: list[Step], cfg: PipelineConfig) -> None:
        """Run, or submit, the steps in order, each after the one before has succeeded."""
        ...


@dataclass(frozen=True)
class Resources:
    time_limit: str
    nodes: int = 1
    tasks_per_node: int = 1  # processes per node (one per GPU for training)
    gpus_per_node: int = 0
    requeue: bool = False  # saves and requeues itself when signalled before its time limit

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node


def resources(step: Step, cfg: PipelineConfig) -> Resources:
    """What a step's placement means on the configured cluster."""
    c = cfg.cluster
    if step.placement is Placement.TRAINING_RANKS:
        return Resources(c.time_limit, c.nodes, tasks_per_node(c), c.gpus_per_node, requeue=True)
    if step.placement is Placement.ONE_DEVICE:
        return Resources(c.time_limit, gpus_per_node=min(1, c.gpus_per_node))
    if step.placement is Placement.MODEL_RANKS:
        s = settled(cfg)
        ranks = s.tensor * s.pipeline
        if c.gpus_per_node <= 0:  # CPU ranks, on one node
            return Resources(c.time_limit, tasks_per_node=ranks)
        per_node = min(ranks, c.gpus_per_node)
        nodes = -(-ranks // per_node)
        return Resources(c.time_limit, nodes, per_node, per_node)
    return Resources(c.cpu_time_limit)  # CPU, and each task of an ARRAY


@contextlib.contextmanager
def failures_recorded(step: Step, cfg: PipelineConfig) -> Iterator[None]:
    """A step run here that fails leaves logs/STEP.failed.json with its error (what
    `make status` shows); one that succeeds clears it."""
    record = RunPaths.of(cfg.workdir).failure(step.name)
    try:
        yield
    except BaseException as e:
        error = f"{type(e).__name__}: {e}".strip().splitlines()[0]
        files.write_json(record, {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "error": error})
        raise
    record.unlink(missing_ok=True)


def stop_if_interrupted(step: Step, result: Any) -> None:
    """A step that saved and stopped on a signal ends the chain here: the steps after it must
    not run on its unfinished outputs (evaluating a half-trained model, say)."""
    if isinstance(result, Interrupted):
        raise StageError(
            f"{step.name}: stopped by a signal at step {result.at_step} after saving; "
            "rerun the same command to resume"
        )
