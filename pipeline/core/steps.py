"""What a step of the run is, to whatever runs it.

A user-facing stage (tokenize, train, evaluate) is one or more steps, each a job of its own
on a cluster: tokenizer, tokenize (an array), verify, index, train, evaluate. A step is a plain
function of the typed config that checks its own completion marker, so running it again is
always safe; it says where it runs (`Placement`), and an executor turns that into processes
or Slurm jobs. Steps never read scheduler variables themselves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipeline.config import PipelineConfig


class Placement(enum.Enum):
    CPU = "cpu"  # one process on a CPU node
    ARRAY = "array"  # one process per task index, all independent (a Slurm job array)
    TRAINING_RANKS = "training ranks"  # every training rank, on every node, at once
    ONE_DEVICE = "one device"  # one process with one GPU (or the CPU, on a CPU run)


@dataclass(frozen=True)
class Interrupted:
    """A step that saved and stopped on a signal before finishing: the steps after it must not
    run on its outputs. `requeue`: it asks the scheduler to start it again (a time limit)."""

    step: int
    requeue: bool


class Step(Protocol):
    name: str
    placement: Placement

    def is_complete(self, cfg: PipelineConfig) -> bool:
        """Its outputs are there, whole, for this config."""
        ...

    def run(self, cfg: PipelineConfig) -> Any:
        """Do the work unless it is complete; returns what its marker records, or Interrupted."""
        ...


class ArrayStep(Step, Protocol):
    """A step of independent tasks; `run` does them all, one after the other."""

    def prepare(self, cfg: PipelineConfig) -> None:
        """Cheap work before anything is submitted that fixes the number of tasks."""
        ...

    def tasks(self, cfg: PipelineConfig) -> int:
        """How many tasks: as prepared, or at most this many before `prepare`."""
        ...

    def run_task(self, cfg: PipelineConfig, index: int) -> Any:
        """Task `index` alone, unless it is complete."""
        ...
