"""What a step says to whatever runs it: where it runs, and that it stopped early.

A user-facing stage (tokenize, train, evaluate) is one or more steps, each a job of its own
on a cluster: tokenizer, tokenize (an array), verify, index, train, evaluate. A step is an
object in its package's steps.py with `is_complete(cfg)` and `run(cfg)`: it checks its own
completion marker, so running it again is always safe (the interface, which the orchestration
defines as it calls it: pipeline.orchestration.graph.Step). It says where it runs (`Placement`),
and an executor turns that into processes or Slurm jobs; steps never read scheduler variables
themselves.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core import files


class Placement(enum.Enum):
    CPU = "cpu"  # one process on a CPU node
    ARRAY = "array"  # one process per task index, all independent (a Slurm job array)
    TRAINING_RANKS = "training ranks"  # every training rank, on every node, at once
    ONE_DEVICE = "one device"  # one process with one GPU (or the CPU, on a CPU run)


@dataclass(frozen=True)
class Interrupted:
    """A step that saved and stopped on a signal before finishing: the steps after it must not
    run on its outputs. `at_step`: the training step it saved; `requeue`: it asks the
    scheduler to start it again (a time limit)."""

    at_step: int
    requeue: bool


class Change(enum.Enum):
    """What a rerun does with an output made from other settings than those asked for now."""

    CONTINUE = "continue"  # carry on from it (more training steps, say)
    REDO = "redo"  # make it again, nothing lost (a cache, an evaluation)
    REFUSE = "refuse"  # it would be lost or mislabelled: refuse, unless force=STEP


class RedoneWhenChanged(abc.ABC):
    """A step whose output is made again, nothing lost, whenever what it would be made from
    differs from what its marker records (an evaluation, an export). A subclass names its
    marker, the JSON file it writes last with a "made_from" entry, and defines made_from.
    `cfg` is the run's PipelineConfig (core sits below the config package)."""

    @abc.abstractmethod
    def marker(self, cfg: Any) -> Path: ...

    @abc.abstractmethod
    def made_from(self, cfg: Any) -> dict: ...

    def recorded(self, cfg: Any) -> dict | None:
        done = files.read_json_or_none(self.marker(cfg))
        return None if done is None else done.get("made_from", {})

    def change(self, recorded: dict, now: dict) -> Change:
        return Change.REDO

    def is_complete(self, cfg: Any) -> bool:
        return self.recorded(cfg) == self.made_from(cfg)
