"""The job graph: which steps a run needs, in order, each with its completion check.

The user-facing stages expand into steps: tokenize = tokenizer (when none is given) -> shard
array -> verify; then train; then evaluate. A step that is already complete is left out, so a
rerun resumes at the first incomplete step and never redoes finished work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from pipeline import corpus, evaluate, shards, tokenize, tokenizer, train, verify
from pipeline.config import world_size
from pipeline.layout import RunLayout


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[..., Any]  # run(cfg) or, for an array, run(cfg, task_index)
    is_complete: Callable[[DictConfig], bool]
    array: int = 0  # number of array tasks; 0 for a single job
    ranks: int = 1  # processes of a distributed job (training, evaluation)
    uses_gpus: bool = False


def prepare_inputs(cfg: DictConfig) -> None:
    """Cheap work done before anything is submitted: the built-in corpus and the shard plan."""
    if not cfg.data.inputs:
        corpus.build(
            RunLayout.of(cfg.workdir).corpus_dir / "builtin.jsonl", cfg.data.builtin_corpus_bytes
        )
    shards.plan(cfg)


def _shards_complete(cfg: DictConfig) -> bool:
    layout = RunLayout.of(cfg.workdir)
    return all(
        tokenize.is_shard_complete(layout.shard_prefix(i)) for i in range(len(shards.plan(cfg)))
    )


def build(cfg: DictConfig) -> list[Step]:
    """Every step the configured stages need, complete ones included (see `pending`)."""
    steps: list[Step] = []
    if "tokenize" in cfg.stages:
        prepare_inputs(cfg)
        steps += [
            Step("tokenizer", tokenizer.run, tokenizer.is_complete),
            Step("tokenize", tokenize.run_task, _shards_complete, array=len(shards.plan(cfg))),
            Step("verify", verify.run, verify.is_complete),
        ]
    gpus = cfg.cluster.gpus_per_node > 0
    if "train" in cfg.stages:
        steps.append(
            Step("train", train.run, train.is_complete, ranks=world_size(cfg), uses_gpus=gpus)
        )
    if "evaluate" in cfg.stages:
        steps.append(Step("evaluate", evaluate.run, evaluate.is_complete, uses_gpus=gpus))
    return steps


def pending(steps: list[Step], cfg: DictConfig) -> list[Step]:
    return [s for s in steps if not s.is_complete(cfg)]
