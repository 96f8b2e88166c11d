"""Downstream scores of one checkpoint (eval.harness_tasks), and the tasks' data beforehand.

score_checkpoint is what a downstream job runs: the checkpoint loaded in the job's layout
(scoring_model), every task scored offline from the task cache, one JSON record written
atomically.
missing_task_data and fetch_task_data are for the launcher, before any job is submitted: which
tasks a compute node without network could not score, and fetching their data into the cache
from a machine with network (each in a subprocess, pipeline.evaluation.task_data)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.core import files, log
from pipeline.core.errors import ConfigError, StageError
from pipeline.core.paths import RunPaths
from pipeline.evaluation import harness
from pipeline.evaluation.scoring import Scorer
from pipeline.runtime import distributed

_log = log.get()


def task_cache(cfg: PipelineConfig) -> Path:
    """Where the tasks' data is fetched to and read from: eval.cache_dir, else
    WORKDIR/eval/cache."""
    if cfg.eval.cache_dir:
        return Path(cfg.eval.cache_dir).expanduser()
    return RunPaths.of(cfg.workdir).eval_dir / "cache"


def _survey(cfg: PipelineConfig, cache: Path, fetch: bool) -> dict[str, str]:
    """{task: why} of the tasks whose data is not in `cache` (after fetching it, if `fetch`);
    a task name neither the harness nor eval.task_paths knows is a ConfigError."""
    if not harness.installed():
        raise ConfigError(f"eval.harness_tasks: {harness.NOT_INSTALLED}")
    tasks = list(cfg.eval.harness_tasks)
    if not tasks:
        return {}
    command = [
        sys.executable,
        "-m",
        "pipeline.evaluation.task_data",
        "fetch" if fetch else "check",
        str(cache),
        json.dumps(tasks),
        json.dumps([str(Path(p).expanduser()) for p in cfg.eval.task_paths]),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StageError(f"reading the tasks of eval.harness_tasks failed: {tail}")
    found = json.loads(lines[-1])
    if found["unknown"]:
        raise ConfigError(
            f"eval.harness_tasks: unknown task(s) {', '.join(found['unknown'])} (neither "
            "lm-evaluation-harness nor eval.task_paths defines them)"
        )
    return found["missing"]


def missing_task_data(cfg: PipelineConfig) -> list[str]:
    """The tasks of eval.harness_tasks whose data is not in the task cache (nor on local disk,
    for tasks of eval.task_paths), as a job without network would find them."""
    return sorted(_survey(cfg, task_cache(cfg), fetch=False))


def fetch_task_data(cfg: PipelineConfig, cache: Path) -> list[str]:
    """Download the data of eval.harness_tasks into `cache` (where there is network); returns
    the tasks still without data, each logged in one line with why."""
    missing = _survey(cfg, cache, fetch=True)
    for task, why in sorted(missing.items()):
        _log.info(f"eval.harness_tasks: {task}: its data could not be fetched ({why})")
    return sorted(missing)


def scoring_tensor_parallel(trained_tensor: int, ranks: int) -> int:
    """The tensor-parallel size a job of `ranks` scores a checkpoint in: the one it was trained
    in, or where the job's ranks do not divide by it, the largest size dividing both (the
    model's heads, query groups and padded vocabulary divide by any divisor of the trained
    size)."""
    return math.gcd(max(1, trained_tensor), max(1, ranks))


@dataclass
class ScoringModel:
    """A checkpoint's model in the job's layout, ready to score requests."""

    engine: Any  # pipeline.training.engine.Engine
    scorer: Scorer
    sp: Any  # the run's sentencepiece processor
    state: dict  # the checkpoint's state.json


def scoring_model(cfg: PipelineConfig, checkpoint: Path) -> ScoringModel:
    """The model of checkpoint folder `checkpoint`, loaded as the job's ranks hold it: whole on
    each group of the tensor-parallel size it was trained in (pipeline stages merged: forward
    only, a model needs far less memory than its training did), the job's other ranks
    data-parallel."""
    from megatron.core import parallel_state

    from pipeline.data.datasets import load_manifest
    from pipeline.data.tokenizer import load
    from pipeline.evaluation.evaluate import one_stage
    from pipeline.training import checkpoint as checkpoints
    from pipeline.training.engine import Engine

    folder = Path(checkpoint).resolve()
    why = checkpoints.problem(folder)
    if why is not None:
        raise StageError(f"{folder}: not a whole, valid checkpoint ({why})")
    state = files.read_json(folder / "state.json")
    layout = state.get("layout", {})
    manifest = load_manifest(RunPaths.of(cfg.workdir))
    tensor = scoring_tensor_parallel(layout.get("tensor", 1), distributed.from_env().world_size)
    engine = Engine(one_stage(cfg, tensor), manifest["vocab_size"], layout.get("padded_vocab_size"))
    checkpoints.load(folder, engine.backend, engine.chunks, None)
    split = tensor > 1
    sp = load(manifest["tokenizer"])
    scorer = Scorer(
        engine.chunks[0],
        sp.vocab_size(),
        engine.device,
        harness.batch_size(cfg),
        engine.dp_rank,
        engine.dp_size,
        data_group=parallel_state.get_data_parallel_group() if engine.dp_size > 1 else None,
        tensor_group=parallel_state.get_tensor_model_parallel_group() if split else None,
    )
    return ScoringModel(engine, scorer, sp, state)


def _from_first_rank(value: Any) -> Any:
    """The first rank's `value` on every rank: the harness returns its results on the first
    process of each node alone (None elsewhere)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def score_checkpoint(cfg: PipelineConfig, checkpoint: Path, out: Path) -> dict:
    """Score eval.harness_tasks on the model of checkpoint folder `checkpoint`, offline, over
    the job's ranks (scoring_model); writes `out` (JSON, atomically, on the first rank) and
    returns the record: checkpoint, step, tokens (trained), tasks ({task: {metric: value}}),
    requests, requests_per_s, seconds, batch_size, ranks (data-parallel), tensor_parallel."""
    if not harness.installed():
        raise ConfigError(f"eval.harness_tasks: {harness.NOT_INSTALLED}")
    # before datasets is imported: the Hugging Face libraries read these once
    os.environ.update(harness.cache_env(task_cache(cfg), offline=True))
    started = time.time()
    folder = Path(checkpoint).resolve()
    model = scoring_model(cfg, folder)
    lm = harness.language_model(cfg, model.scorer, model.sp)
    out_of_harness = harness.evaluate(list(cfg.eval.harness_tasks), list(cfg.eval.task_paths), lm)
    engine, state = model.engine, model.state
    record = {
        "checkpoint": folder.name,
        "step": state["step"],
        "tokens": state.get("run", {}).get("tokens"),
        "tasks": _from_first_rank(harness.scores(out_of_harness) if out_of_harness else None),
        "requests": lm.requests,
        "requests_per_s": lm.requests / lm.seconds if lm.seconds else 0.0,
        "batch_size": lm.scorer.batch_size,
        "ranks": engine.dp_size,
        "tensor_parallel": engine.settled.tensor,
        "seconds": round(time.time() - started, 2),
    }
    if engine.rank.is_first:
        files.write_json(Path(out), record)
    _log.info(  # from the rank that logs (the training's: the last)
        f"{folder.name}: {len(record['tasks'])} task(s) scored, "
        f"{record['requests_per_s']:.1f} requests/s"
    )
    return record
