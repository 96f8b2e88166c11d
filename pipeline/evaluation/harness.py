"""Downstream tasks (eval.harness_tasks) through EleutherAI's lm-evaluation-harness, an optional
extra (`pip install '.[eval]'`): its tasks, those of eval.task_paths beside them, scored by the
pipeline's model in batches (pipeline.evaluation.harness_model). Scoring reads the tasks' data
offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1) from the task cache: compute nodes often have
no network, and pipeline.evaluation.downstream fetches the data beforehand."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import torch

from pipeline.config import PipelineConfig
from pipeline.config.derived import settled
from pipeline.evaluation.scoring import Scorer

NOT_INSTALLED = "the lm_eval package is not installed (pip install '.[eval]')"


def installed() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def cache_env(cache: Path | None, offline: bool) -> dict[str, str]:
    """The environment that points Hugging Face datasets and hub downloads at the task cache,
    and keeps them off the network when `offline` (on it otherwise, whatever was inherited)."""
    env = {}
    if cache is not None:
        env.update(HF_DATASETS_CACHE=str(cache / "datasets"), HF_HUB_CACHE=str(cache / "hub"))
    flag = "1" if offline else "0"
    env.update(HF_DATASETS_OFFLINE=flag, HF_HUB_OFFLINE=flag, HF_EVALUATE_OFFLINE=flag)
    return env


def task_manager(task_paths: list[str]):
    """The harness's tasks with those of eval.task_paths (folders of task YAMLs) added."""
    from lm_eval.tasks import TaskManager

    paths = [str(Path(p).expanduser()) for p in task_paths]
    return TaskManager(include_path=paths or None)


def batch_size(cfg: PipelineConfig) -> int:
    """Requests per forward pass: eval.micro_batch_size (else train.micro_batch_size), which
    fits whole sequences of model.seq_length, as long as any request may be."""
    return cfg.eval.micro_batch_size or settled(cfg).micro_batch_size


def max_length(cfg: PipelineConfig) -> int:
    """The context the exported model declares (config.json's max_position_embeddings)."""
    return cfg.model.max_position_embeddings or cfg.model.seq_length


def model(
    cfg: PipelineConfig,
    net: torch.nn.Module,
    sp,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    batch: int | None = None,
):
    """The harness's model over `net`, its requests split over `world` data-parallel ranks."""
    scorer = Scorer(net, sp.vocab_size(), device, batch or batch_size(cfg), rank, world)
    return language_model(cfg, scorer, sp)


def language_model(cfg: PipelineConfig, scorer: Scorer, sp):
    """The harness's model whose requests `scorer` scores."""
    from pipeline.evaluation.harness_model import PipelineLM

    return PipelineLM(scorer, sp, max_length(cfg))


_WORKERS_END = []  # whether the hook below is registered in this process


def pool_workers_end_on_sigterm() -> None:
    """Processes forked from this one from now on end on SIGTERM, whatever this one does with
    it: the harness computes some metrics' stderr in a multiprocessing pool, which it ends with
    SIGTERM, and a submitit job's handler (inherited by a fork) ignores SIGTERM, so the pool's
    end would wait for its workers forever."""
    if not _WORKERS_END:
        os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        _WORKERS_END.append(True)


def evaluate(tasks: list[str], task_paths: list[str], lm, log_samples: bool = False) -> dict:
    """lm_eval.simple_evaluate of `tasks` with `lm`, as it returns it (on the first process of
    each node; None on the others)."""
    import lm_eval

    pool_workers_end_on_sigterm()

    return lm_eval.simple_evaluate(
        model=lm, tasks=tasks, task_manager=task_manager(task_paths), log_samples=log_samples
    )


def scores(out: dict) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} of simple_evaluate's results, metrics named as the harness
    names them (acc,none; acc_stderr,none), values that are not numbers left out."""
    return {
        task: {
            k: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for task, metrics in out["results"].items()
    }
