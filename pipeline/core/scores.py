"""The downstream scores of a run's checkpoints, read without torch: eval/downstream/<checkpoint>
.json, one per scored checkpoint (checkpoint, step, tokens, tasks: {task: {metric: value}}), and
the best checkpoint by one task's metric (eval.select_by=TASK/METRIC)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.paths import RunPaths

# lm-evaluation-harness's metrics where less is better; every other one (acc, acc_norm,
# exact_match, f1, ...) is better higher
LOWER_IS_BETTER = {"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"}


def read(paths: RunPaths) -> list[dict]:
    """Every scored checkpoint's record, by step; a damaged file is left out (it is rewritten
    when its checkpoint is scored again)."""
    records = []
    for path in sorted(paths.downstream_dir.glob("iter_???????.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "tasks" in record:
            records.append(record)
    return sorted(records, key=lambda r: r.get("step", 0))


def metrics(record: dict) -> dict[str, float]:
    """{"TASK/METRIC": value} of a record's scores: its numbers, without standard errors and
    the harness's sample counts."""
    return {
        f"{task}/{metric}": float(value)
        for task, values in record.get("tasks", {}).items()
        for metric, value in values.items()
        if isinstance(value, (int, float)) and "stderr" not in metric and metric != "sample_len"
    }


def split_select_by(select_by: str) -> tuple[str, str] | None:
    """(TASK, METRIC) of eval.select_by, or None when it is not of that form."""
    task, _, metric = select_by.partition("/")
    return (task, metric) if task and metric and "/" not in metric else None


def metric_value(tasks: dict, task: str, metric: str) -> float | None:
    """The value of `metric` of `task` in a record's tasks; lm-evaluation-harness names its
    metrics with their filter (acc,none), which METRIC may leave out."""
    for name, value in tasks.get(task, {}).items():
        if name in (metric, f"{metric},none") or name.split(",")[0] == metric:
            return float(value) if isinstance(value, (int, float)) else None
    return None


def best(paths: RunPaths, select_by: str) -> str | None:
    """The scored checkpoint still on disk with the best value of eval.select_by (TASK/METRIC),
    the later one on a tie; None when none was scored on it."""
    task, metric = split_select_by(select_by) or ("", "")
    lower = metric.split(",")[0] in LOWER_IS_BETTER
    found: tuple[float, int, str] | None = None
    for record in read(paths):
        value = metric_value(record["tasks"], task, metric)
        name = str(record.get("checkpoint", ""))
        if value is None or not (paths.checkpoints / Path(name).name).is_dir():
            continue
        key = (-value if lower else value, int(record.get("step", 0)), Path(name).name)
        found = key if found is None or key > found else found
    return found[2] if found else None
