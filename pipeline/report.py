"""What a finished run says about itself: summary.json in the run folder."""

from __future__ import annotations

from pipeline import files
from pipeline.layout import RunLayout

SUMMARY_FROM_TRAIN = (
    "tokens",
    "vocab_size",
    "train_steps",
    "trained_tokens",
    "first_train_loss",
    "last_train_loss",
    "best_val_loss",
    "tokens_per_s",
    "best_checkpoint",
    "skipped_steps",
)
SUMMARY_FROM_EVAL = ("test_loss", "test_ppl", "test_tokens", "checkpoint")


def write_summary(layout: RunLayout) -> dict:
    """Merge what the stages recorded into summary.json (stages that have not run are absent)."""
    summary: dict = {"workdir": str(layout.root)}
    manifest = files.read_json_or_none(layout.manifest)
    if manifest:
        summary["tokens"] = manifest["total"]["split_tokens"]["train"]
        summary["vocab_size"] = manifest["vocab_size"]
        summary["rejected_records"] = sum(manifest["total"]["rejected"].values())
    train = files.read_json_or_none(layout.train_done) or {}
    summary.update({k: train[k] for k in SUMMARY_FROM_TRAIN if k in train})
    evaluation = files.read_json_or_none(layout.eval_done) or {}
    summary.update({k: evaluation[k] for k in SUMMARY_FROM_EVAL if k in evaluation})
    files.write_json(layout.summary, summary)
    return summary
