"""The one place the downstream jobs call the scoring of a checkpoint on eval.harness_tasks:
`score_checkpoint`, `missing_task_data` and `fetch_task_data`. These are the interim versions,
on lm-evaluation-harness with the model's one-request-per-forward LM
(pipeline.evaluation.harness); pipeline.evaluation.downstream replaces them with the batched
scoring, under the same signatures."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths

FETCHED = "fetched.json"  # in the cache: the tasks whose data was fetched into it


def task_cache(cfg: PipelineConfig) -> Path:
    """eval.cache_dir, or the run folder's eval/cache."""
    given = cfg.eval.cache_dir
    return Path(given).expanduser() if given else RunPaths.of(cfg.workdir).default_task_cache


def offline_environment(cache: Path) -> dict[str, str]:
    """What a job that reads the tasks' data from the cache, and never the network, runs with."""
    return {
        "HF_DATASETS_CACHE": str(cache / "datasets"),
        "HF_HOME": str(cache / "huggingface"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }


def _local_tasks(task_paths: list[str]) -> set[str]:
    """Task names defined by the YAMLs under eval.task_paths (their data is on local disk)."""
    import yaml

    names = set()
    for folder in task_paths:
        for path in Path(folder).expanduser().rglob("*.y*ml"):
            try:
                loaded = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(loaded, dict):
                for key in ("task", "group"):
                    if isinstance(loaded.get(key), str):
                        names.add(loaded[key])
    return names


def missing_task_data(cfg: PipelineConfig) -> list[str]:
    """The tasks of eval.harness_tasks whose data is neither under eval.task_paths nor fetched
    into the cache."""
    fetched = files.read_json_or_none(task_cache(cfg) / FETCHED) or {}
    have = _local_tasks(list(cfg.eval.task_paths)) | set(fetched.get("tasks", []))
    return [task for task in cfg.eval.harness_tasks if task not in have]


def fetch_task_data(cfg: PipelineConfig, cache: Path) -> None:
    """Download the data of eval.harness_tasks into `cache` (on a machine with network)."""
    cache.mkdir(parents=True, exist_ok=True)
    env = offline_environment(cache)
    os.environ.update({k: v for k, v in env.items() if "OFFLINE" not in k})
    from lm_eval.tasks import TaskManager, get_task_dict

    tasks = list(cfg.eval.harness_tasks)
    get_task_dict(tasks, TaskManager(include_path=list(cfg.eval.task_paths) or None))
    files.write_json(cache / FETCHED, {"tasks": sorted(set(tasks))})


def score_checkpoint(cfg: PipelineConfig, checkpoint: Path, out: Path) -> dict:
    """Score `checkpoint` on eval.harness_tasks; writes `out` (checkpoint, step, tokens,
    tasks: {task: {metric: value}}) atomically and returns it."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from pipeline.data.datasets import load_manifest
    from pipeline.data.tokenizer import load
    from pipeline.evaluation import harness
    from pipeline.evaluation.evaluate import single_device
    from pipeline.training import checkpoint as checkpoints
    from pipeline.training.engine import Engine

    manifest = load_manifest(RunPaths.of(cfg.workdir))
    written = files.read_json(checkpoint / "state.json").get("layout", {})
    engine = Engine(single_device(cfg), manifest["vocab_size"], written.get("padded_vocab_size"))
    state = checkpoints.load(checkpoint, engine.backend, engine.chunks, None)
    lm = harness._lm(
        engine.chunks[0], load(manifest["tokenizer"]), cfg.model.seq_length, engine.device
    )
    found = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(cfg.eval.harness_tasks),
        task_manager=TaskManager(include_path=list(cfg.eval.task_paths) or None),
    )
    record = {
        "checkpoint": checkpoint.name,
        "step": state["step"],
        "tokens": state.get("run", {}).get("tokens"),
        "tasks": {
            task: {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            for task, metrics in found["results"].items()
        },
    }
    files.write_json(out, record)
    return record
