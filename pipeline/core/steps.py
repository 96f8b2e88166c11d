"""What a step says to whatever runs it: where it runs, and that it stopped early.

A user-facing stage (tokenize, train, evaluate, export) is one or more steps, each a job of its own
on a cluster: tokenizer, tokenize (an array), verify, index, train, evaluate, export. A step
is an object in its package's steps.py, a `Step`: it checks its own completion marker, so
running it again is always safe (`MarkedStep` does this for the steps of one marker, which
state only what they make and from what). It says where it runs (`Placement`),
and an executor turns that into processes or Slurm jobs; steps never read scheduler variables
themselves.

Two meanings of "step" are kept apart. A step, here, is a job of the pipeline (`python -m
pipeline.step STEP`, `force=STEP`, a row of `make status`). One update of the weights is a
training step: `train.steps` counts them, the training's state, its checkpoints and
train/metrics.jsonl record one as "step", and the trainer's method for one is
`Trainer.iteration`; elsewhere it is named as a training step (`Interrupted.at_step`).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core import files, provenance


class Placement(enum.Enum):
    CPU = "cpu"  # one process on a CPU node
    ARRAY = "array"  # one process per task index, all independent (a Slurm job array)
    TRAINING_RANKS = "training ranks"  # every training rank, on every node, at once
    ONE_DEVICE = "one device"  # one process with one GPU (or the CPU, on a CPU run)
    # the training's tensor x pipeline ranks, one GPU each (processes on a CPU run): a model
    # held as it was trained, forward only (downstream scoring)
    MODEL_RANKS = "model-parallel ranks"


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


class Step(abc.ABC):
    """A step of the run. `cfg` is the run's PipelineConfig (core sits below the config
    package); a made-from record is a pipeline.core.provenance.MadeFrom."""

    name: str
    placement: Placement

    @abc.abstractmethod
    def made_from(self, cfg: Any) -> dict:
        """What its output would be made from under this config."""

    @abc.abstractmethod
    def recorded(self, cfg: Any) -> dict | None:
        """What its existing output records it was made from; None: no output; {}: an output
        written before markers recorded it."""

    @abc.abstractmethod
    def is_complete(self, cfg: Any) -> bool:
        """Its outputs are there, whole, for this config."""

    @abc.abstractmethod
    def outputs(self, cfg: Any) -> list[Path]:
        """What it writes in the run folder (what force=STEP moves aside)."""

    @abc.abstractmethod
    def run(self, cfg: Any) -> Any:
        """Do the work unless it is complete; returns what its marker records, or Interrupted."""

    def change(self, recorded: dict, now: dict) -> Change:
        """What a rerun does with an output made from `recorded` when `now` is asked for:
        refused unless a step says otherwise (it would be lost or mislabelled)."""
        return Change.REFUSE

    def fingerprint(self, cfg: Any) -> str:
        """What the steps after it record of this step's output: the fingerprint of the record
        its output holds where that is what the config asks for now (written before a key
        with its default existed, say), else that of what it would be made from now."""
        now = self.made_from(cfg)
        recorded = self.recorded(cfg)
        if recorded and provenance.same(recorded, now, provenance.defaults(cfg)):
            return provenance.fingerprint(recorded)
        return provenance.fingerprint(now)


class ArrayStep(Step):
    """A step of independent tasks (Placement.ARRAY); `run` does them all, one after another."""

    @abc.abstractmethod
    def prepare(self, cfg: Any) -> None:
        """Cheap work before anything is submitted that fixes the number of tasks."""

    @abc.abstractmethod
    def tasks(self, cfg: Any) -> int:
        """How many tasks: as prepared, or at most this many before `prepare`."""

    @abc.abstractmethod
    def run_task(self, cfg: Any, index: int) -> Any:
        """Task `index` alone, unless it is complete."""

    def run(self, cfg: Any) -> list[Any]:
        self.prepare(cfg)
        return [self.run_task(cfg, i) for i in range(self.tasks(cfg))]


class MarkedStep(Step):
    """A step whose output ends with a marker: a JSON file, written last, whose "made_from"
    entry records what the output was made from. The step is complete when that record is
    what the config asks for now; running it again then reads the marker back. A subclass
    states only what it makes and from what: `marker`, `made_from`, `make`, `outputs`, and
    `change` where a changed output is not refused."""

    @abc.abstractmethod
    def marker(self, cfg: Any) -> Path: ...

    @abc.abstractmethod
    def make(self, cfg: Any, made_from: dict) -> Any:
        """Make the output from scratch (or from where an interrupted one stopped), writing the
        marker last; returns what the marker records, or Interrupted."""

    def marked(self, cfg: Any) -> dict | None:
        """What the marker says the output was made from ({}: a marker without it)."""
        done = files.read_json_or_none(self.marker(cfg))
        return None if done is None else done.get("made_from", {})

    def recorded(self, cfg: Any) -> dict | None:
        return self.marked(cfg)

    def is_complete(self, cfg: Any) -> bool:
        marked = self.marked(cfg)
        return bool(marked) and provenance.same(
            marked, self.made_from(cfg), provenance.defaults(cfg)
        )

    def run(self, cfg: Any) -> Any:
        if self.is_complete(cfg):
            return files.read_json(self.marker(cfg))
        return self.make(cfg, self.made_from(cfg))
