"""The job graph: which steps a run needs, in order, each with its completion check.

The user-facing stages expand into steps: tokenize = tokenizer (when none is given) -> shard
array -> verify; train = index (the dataset index cache, on a CPU) -> train; then evaluate. A step that is already complete is left out, so a
rerun resumes at the first incomplete step and never redoes finished work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from pipeline import corpus, files, index_cache, shards, tokenize, tokenizer, verify
from pipeline.config import tasks_per_node
from pipeline.layout import RunLayout


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[..., Any]  # run(cfg) or, for an array, run(cfg, task_index)
    is_complete: Callable[[DictConfig], bool]
    array: int = 0  # number of array tasks; 0 for a single job
    nodes: int = 1
    tasks_per_node: int = 1  # processes per node (one per GPU for training)
    gpus_per_node: int = 0
    time_limit: str = "01:00:00"
    requeue: bool = False  # saves and requeues itself when signalled before its time limit

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node


def run_train(cfg: DictConfig) -> dict:
    from pipeline import train  # torch and megatron-core: imported by the jobs that need them

    return train.run(cfg)


def run_evaluate(cfg: DictConfig) -> dict:
    from pipeline import evaluate

    return evaluate.run(cfg)


def _train_complete(cfg: DictConfig) -> bool:
    return RunLayout.of(cfg.workdir).train_done.exists()


def _evaluate_complete(cfg: DictConfig) -> bool:
    """As evaluate.is_complete, without importing torch into the launcher."""
    layout = RunLayout.of(cfg.workdir)
    return layout.eval_done.exists() and layout.report.exists()


def prepare_inputs(cfg: DictConfig) -> None:
    """Cheap work done before anything is submitted: the built-in corpus and the shard plan."""
    if not cfg.data.inputs:
        corpus.build(
            RunLayout.of(cfg.workdir).corpus_dir / "builtin.jsonl", cfg.data.builtin_corpus_bytes
        )
    shards.plan(cfg)


def _shards_complete(cfg: DictConfig) -> bool:
    layout = RunLayout.of(cfg.workdir)
    planned = files.read_json_or_none(shards.plan_path(cfg))
    if planned is None:
        return False
    return all(
        tokenize.is_shard_complete(layout.shard_prefix(i)) for i in range(len(planned["shards"]))
    )


def build(cfg: DictConfig, prepare: bool = True) -> list[Step]:
    """Every step the configured stages need, complete ones included (see `pending`).
    With prepare=False nothing is written: a run not yet planned shows an empty array."""
    c = cfg.cluster
    steps: list[Step] = []
    if "tokenize" in cfg.stages:
        if prepare:
            prepare_inputs(cfg)
        cpu = dict(time_limit=c.cpu_time_limit)
        planned = files.read_json_or_none(shards.plan_path(cfg))
        array = len(planned["shards"]) if planned else cfg.data.num_shards  # at most that many
        steps += [
            Step("tokenizer", tokenizer.run, tokenizer.is_complete, **cpu),
            Step("tokenize", tokenize.run_task, _shards_complete, array=array, **cpu),
            Step("verify", verify.run, verify.is_complete, **cpu),
        ]
    if "train" in cfg.stages:
        steps.append(
            Step("index", index_cache.run, index_cache.is_complete, time_limit=c.cpu_time_limit)
        )
        steps.append(
            Step(
                "train",
                run_train,
                _train_complete,
                nodes=c.nodes,
                tasks_per_node=tasks_per_node(cfg),
                gpus_per_node=c.gpus_per_node,
                time_limit=c.time_limit,
                requeue=True,
            )
        )
    if "evaluate" in cfg.stages:
        steps.append(
            Step(
                "evaluate",
                run_evaluate,
                _evaluate_complete,
                gpus_per_node=min(1, c.gpus_per_node),
                time_limit=c.time_limit,
            )
        )
    return steps


def pending(steps: list[Step], cfg: DictConfig) -> list[Step]:
    return [s for s in steps if not s.is_complete(cfg)]
