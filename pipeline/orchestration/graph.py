"""The steps a run needs, in order. The user-facing stages expand into steps:

    tokenize = tokenizer -> tokenize (an array, one task per shard) -> verify
    train    = index (the dataset index cache, on a CPU) -> train
    evaluate = evaluate

Each step owns its completion check (pipeline.*/steps.py); the graph only orders them. A step
that is already complete is left out of the run, so a rerun resumes at the first incomplete
step and never redoes finished work.
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.core.steps import Step
from pipeline.data.steps import INDEX, TOKENIZE, TOKENIZER, VERIFY
from pipeline.evaluation.steps import EVALUATE
from pipeline.training.steps import TRAIN

STAGES: dict[str, list[Step]] = {
    "tokenize": [TOKENIZER, TOKENIZE, VERIFY],
    "train": [INDEX, TRAIN],
    "evaluate": [EVALUATE],
}


def steps(cfg: PipelineConfig) -> list[Step]:
    """Every step the configured stages need, in order, complete ones included."""
    return [step for stage in cfg.stages for step in STAGES[stage]]


def pending(cfg: PipelineConfig) -> list[Step]:
    return [step for step in steps(cfg) if not step.is_complete(cfg)]


def by_name(cfg: PipelineConfig) -> dict[str, Step]:
    return {step.name: step for step in steps(cfg)}


def step_named(name: str) -> Step:
    """Any step by its name (tokenizer, tokenize, verify, index, train, evaluate)."""
    return {step.name: step for stage in STAGES.values() for step in stage}[name]
