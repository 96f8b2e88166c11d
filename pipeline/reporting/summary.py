"""summary.json: the headline figures of a run, merged from what its steps recorded, and the
training metrics as logged (train/metrics.jsonl)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.core import files, scores
from pipeline.core.paths import RunPaths

SUMMARY_FROM_TRAIN = (
    "vocab_size",
    "train_steps",
    "trained_tokens",
    "first_train_loss",
    "last_train_loss",
    "best_val_loss",
    "tokens_per_s",
    "parameters",
    "active_parameters",
    "best_checkpoint",
    "skipped_steps",
    "wall_seconds",
    "gpu_hours",
)
SUMMARY_FROM_EVAL = ("test_loss", "test_ppl", "test_bpb", "test_tokens", "checkpoint")


@dataclass(frozen=True)
class Metrics:
    train: list[dict]
    validation: list[dict]
    resumes: list[dict]
    saves: list[dict]  # each checkpoint: how long training waited, how long it took


def read_metrics(paths: RunPaths) -> Metrics:
    """train/metrics.jsonl by kind. A step logged again by a later attempt (one that resumed
    from a checkpoint older than the last lines logged) replaces the earlier record."""
    if not paths.metrics.exists():
        return Metrics([], [], [], [])
    records = [json.loads(line) for line in paths.metrics.read_text().splitlines() if line]

    def last_per_step(key: str) -> list[dict]:
        by_step = {r["step"]: r for r in records if key in r}
        return [by_step[s] for s in sorted(by_step)]

    resumes = [r for r in records if "resumed_from" in r]
    return Metrics(
        last_per_step("loss"),
        last_per_step("val_loss"),
        resumes,
        last_per_step("checkpoint_blocked_s"),
    )


def read_failures(paths: RunPaths) -> list[dict]:
    """train/failures.jsonl: each fault a training attempt ended with, oldest first."""
    if not paths.failures_log.exists():
        return []
    return [json.loads(line) for line in paths.failures_log.read_text().splitlines() if line]


def read_stragglers(paths: RunPaths) -> list[dict]:
    """The ranks named as stragglers (train/metrics.jsonl), each with the step it was named at."""
    if not paths.metrics.exists():
        return []
    records = [json.loads(line) for line in paths.metrics.read_text().splitlines() if line]
    return [{"step": r["step"], **s} for r in records for s in r.get("stragglers", [])]


def read_router_health(paths: RunPaths) -> dict | None:
    """A mixture of experts' last router-health record (train/metrics.jsonl); None: none yet,
    or a dense model."""
    if not paths.metrics.exists():
        return None
    last = None
    for line in paths.metrics.read_text().splitlines():
        if '"moe_layers"' in line:
            last = line
    return json.loads(last) if last else None


def current_evaluation(paths: RunPaths) -> dict:
    """eval/DONE.json if it evaluated the training train/DONE.json records, else {}: after a
    training went on, its earlier evaluation describes another model."""
    evaluation = files.read_json_or_none(paths.eval_done) or {}
    train = files.read_json_or_none(paths.train_done) or {}
    evaluated = evaluation.get("made_from", {}).get("inputs", {}).get("train")
    if evaluated and train.get("fingerprint") and evaluated != train["fingerprint"]:
        return {}
    return evaluation


def write_summary(paths: RunPaths, evaluation: dict | None = None) -> dict:
    """Merge what the stages recorded into summary.json (stages that have not run are absent,
    and so is an evaluation of an earlier training); `evaluation` is the evaluation's result
    before its marker is written."""
    summary: dict = {"workdir": str(paths.root)}
    manifest = files.read_json_or_none(paths.manifest)
    train = files.read_json_or_none(paths.train_done) or {}
    if manifest:
        splits = manifest["total"]["split_tokens"]
        summary["train_split_tokens"] = splits["train"]
        summary["all_splits_tokens"] = sum(splits.values())
        summary["vocab_size"] = manifest["vocab_size"]
        summary["rejected_records"] = sum(manifest["total"]["rejected"].values())
        summary["duplicate_documents"] = manifest["total"].get("duplicates", {}).get("documents", 0)
    if "tokens" in train:  # the training split it read (data.prepared: another run's)
        summary["train_split_tokens"] = train["tokens"]
    # `tokens`, the name before 0.7, kept for readers of earlier summaries
    if "train_split_tokens" in summary:
        summary["tokens"] = summary["train_split_tokens"]
    summary.update({k: train[k] for k in SUMMARY_FROM_TRAIN if k in train})
    summary["resumes"] = len(read_metrics(paths).resumes)
    failures = read_failures(paths)
    summary["restarts"] = sum(r["action"].startswith(("requeued", "restarted")) for r in failures)
    summary["lost_seconds"] = round(sum(r["seconds_lost"] for r in failures), 1)
    if evaluation is None:
        evaluation = current_evaluation(paths)
    summary.update({k: evaluation[k] for k in SUMMARY_FROM_EVAL if k in evaluation})
    if "sets" in evaluation:
        summary["set_ppl"] = {name: r["ppl"] for name, r in evaluation["sets"].items()}
        summary["set_bpb"] = {name: r.get("bpb") for name, r in evaluation["sets"].items()}
    scored = scores.read(paths)
    if scored:  # each checkpoint scored on the downstream tasks, by step
        keys = ("checkpoint", "step", "tokens", "tasks")
        summary["downstream"] = [{k: r.get(k) for k in keys} for r in scored]
    files.write_json(paths.summary, summary)
    return summary
