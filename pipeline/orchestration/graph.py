"""The steps a run needs, in order. The user-facing stages expand into steps:

    tokenize = tokenizer -> tokenize (an array, one task per shard) -> verify
    train    = index (the dataset index cache, on a CPU) -> train
    evaluate = evaluate
    export   = export (a Hugging Face model folder; not among the default stages)

Each step owns its completion check (pipeline.*/steps.py); the graph only orders them. A step
that is already complete is left out of the run, so a rerun resumes at the first incomplete
step and never redoes finished work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pipeline.config import PipelineConfig
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import Change, Placement
from pipeline.data.steps import INDEX, TOKENIZE, TOKENIZER, VERIFY
from pipeline.evaluation.steps import EVALUATE
from pipeline.exporting.steps import EXPORT
from pipeline.training.steps import TRAIN


class Step(Protocol):
    """A step of the run (pipeline.*/steps.py); see pipeline.core.steps."""

    name: str
    placement: Placement

    def is_complete(self, cfg: PipelineConfig) -> bool:
        """Its outputs are there, whole, for this config."""
        ...

    def run(self, cfg: PipelineConfig) -> Any:
        """Do the work unless it is complete; returns what its marker records, or Interrupted."""
        ...

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        """What its output would be made from under this config (pipeline.core.provenance)."""
        ...

    def recorded(self, cfg: PipelineConfig) -> MadeFrom | None:
        """What its existing output records it was made from; None: no output; {}: an output
        written before markers recorded it."""
        ...

    def change(self, recorded: MadeFrom, now: MadeFrom) -> Change:
        """What a rerun does with an output made from `recorded` when `now` is asked for."""
        ...

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        """What it writes in the run folder (what force=STEP moves aside)."""
        ...


class ArrayStep(Step, Protocol):
    """A step of independent tasks (Placement.ARRAY); `run` does them all, one after another."""

    def prepare(self, cfg: PipelineConfig) -> None:
        """Cheap work before anything is submitted that fixes the number of tasks."""
        ...

    def tasks(self, cfg: PipelineConfig) -> int:
        """How many tasks: as prepared, or at most this many before `prepare`."""
        ...

    def run_task(self, cfg: PipelineConfig, index: int) -> Any:
        """Task `index` alone, unless it is complete."""
        ...


STEPS_OF_STAGE: dict[str, list[Step]] = {
    "tokenize": [TOKENIZER, TOKENIZE, VERIFY],
    "train": [INDEX, TRAIN],
    "evaluate": [EVALUATE],
    "export": [EXPORT],
}


ALL_STEPS: list[Step] = [step for stage in STEPS_OF_STAGE.values() for step in stage]


def steps(cfg: PipelineConfig) -> list[Step]:
    """Every step the configured stages need, in order, complete ones included."""
    return [step for stage in cfg.stages for step in STEPS_OF_STAGE[stage]]


def pending(cfg: PipelineConfig) -> list[Step]:
    return [step for step in steps(cfg) if not step.is_complete(cfg)]


def by_name(cfg: PipelineConfig) -> dict[str, Step]:
    return {step.name: step for step in steps(cfg)}


def stage_of(name: str) -> str:
    """The stage a step belongs to."""
    return next(stage for stage, steps in STEPS_OF_STAGE.items() if name in {s.name for s in steps})


def step_named(name: str) -> Step:
    """Any step by its name (tokenizer, tokenize, verify, index, train, evaluate, export)."""
    return {step.name: step for step in ALL_STEPS}[name]
