"""Downstream scores of one checkpoint (eval.harness_tasks), and the tasks' data beforehand.

score_checkpoint is what a downstream job runs: the checkpoint loaded as the evaluation loads
it, every task scored offline from the task cache, one JSON record written atomically.
missing_task_data and fetch_task_data are for the launcher, before any job is submitted: which
tasks a compute node without network could not score, and fetching their data into the cache
from a machine with network (each in a subprocess, pipeline.evaluation.task_data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core import files, log
from pipeline.core.errors import ConfigError, StageError
from pipeline.core.paths import RunPaths
from pipeline.evaluation import harness

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


def score_checkpoint(cfg: PipelineConfig, checkpoint: Path, out: Path) -> dict:
    """Score eval.harness_tasks on the model of checkpoint folder `checkpoint`, offline, over
    the job's data-parallel ranks; writes `out` (JSON, atomically, on the first rank) and
    returns the record: checkpoint, step, tokens (trained), tasks ({task: {metric: value}}),
    requests, requests_per_s, seconds, batch_size, ranks."""
    if not harness.installed():
        raise ConfigError(f"eval.harness_tasks: {harness.NOT_INSTALLED}")
    # before datasets is imported: the Hugging Face libraries read these once
    os.environ.update(harness.cache_env(task_cache(cfg), offline=True))
    started = time.time()
    from pipeline.data.datasets import load_manifest
    from pipeline.data.tokenizer import load
    from pipeline.evaluation.evaluate import single_device
    from pipeline.training import checkpoint as checkpoints
    from pipeline.training.engine import Engine

    folder = Path(checkpoint).resolve()
    why = checkpoints.problem(folder)
    if why is not None:
        raise StageError(f"{folder}: not a whole, valid checkpoint ({why})")
    state = files.read_json(folder / "state.json")
    manifest = load_manifest(RunPaths.of(cfg.workdir))
    padded = state.get("layout", {}).get("padded_vocab_size")
    engine = Engine(single_device(cfg), manifest["vocab_size"], padded)
    checkpoints.load(folder, engine.backend, engine.chunks, None)
    sp = load(manifest["tokenizer"])
    lm = harness.model(cfg, engine.chunks[0], sp, engine.device, engine.dp_rank, engine.dp_size)
    out_of_harness = harness.evaluate(list(cfg.eval.harness_tasks), list(cfg.eval.task_paths), lm)
    record = {
        "checkpoint": folder.name,
        "step": state["step"],
        "tokens": state.get("run", {}).get("tokens"),
        "tasks": harness.scores(out_of_harness),
        "requests": lm.requests,
        "requests_per_s": lm.requests / lm.seconds if lm.seconds else 0.0,
        "batch_size": lm.scorer.batch_size,
        "ranks": engine.dp_size,
        "seconds": round(time.time() - started, 2),
    }
    if engine.rank.is_first:
        files.write_json(Path(out), record)
        _log.info(
            f"{folder.name}: {len(record['tasks'])} task(s) scored, "
            f"{record['requests_per_s']:.1f} requests/s"
        )
    return record
