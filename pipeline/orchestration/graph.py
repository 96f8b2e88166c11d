"""The steps a run needs, in order. The user-facing stages expand into steps:

    tokenize = tokenizer -> tokenize (an array, one task per shard) -> verify
    train    = index (the dataset index cache, on a CPU) -> train
    evaluate = downstream (only with eval.harness_tasks) -> evaluate
    export   = export (a Hugging Face model folder; not among the default stages)

Each step owns its completion check (pipeline.*/steps.py, each a pipeline.core.steps.Step); the
graph only orders them. A step
that is already complete is left out of the run, so a rerun resumes at the first incomplete
step and never redoes finished work.
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.core.steps import ArrayStep, Step
from pipeline.data.steps import INDEX, TOKENIZE, TOKENIZER, VERIFY
from pipeline.evaluation.downstream_step import DOWNSTREAM
from pipeline.evaluation.steps import EVALUATE
from pipeline.exporting.steps import EXPORT
from pipeline.training.steps import TRAIN

__all__ = ["ArrayStep", "Step", "steps", "pending", "by_name", "stage_of", "step_named"]

STEPS_OF_STAGE: dict[str, list[Step]] = {
    "tokenize": [TOKENIZER, TOKENIZE, VERIFY],
    "train": [INDEX, TRAIN],
    "evaluate": [DOWNSTREAM, EVALUATE],
    "export": [EXPORT],
}


ALL_STEPS: list[Step] = [step for stage in STEPS_OF_STAGE.values() for step in stage]


def steps(cfg: PipelineConfig) -> list[Step]:
    """Every step the configured stages need, in order, complete ones included."""
    return [step for stage in cfg.stages for step in STEPS_OF_STAGE[stage] if _needed(step, cfg)]


def _needed(step: Step, cfg: PipelineConfig) -> bool:
    """The downstream step is there when tasks are configured; every other step always."""
    return step is not DOWNSTREAM or bool(cfg.eval.harness_tasks)


def pending(cfg: PipelineConfig) -> list[Step]:
    return [step for step in steps(cfg) if not step.is_complete(cfg)]


def by_name(cfg: PipelineConfig) -> dict[str, Step]:
    return {step.name: step for step in steps(cfg)}


def stage_of(name: str) -> str:
    """The stage a step belongs to."""
    return next(stage for stage, steps in STEPS_OF_STAGE.items() if name in {s.name for s in steps})


def step_named(name: str) -> Step:
    """Any step by its name (tokenizer, tokenize, verify, index, train, downstream, evaluate,
    export)."""
    return {step.name: step for step in ALL_STEPS}[name]
