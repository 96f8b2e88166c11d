"""What a rerun of training resumes from, and whether it can under this config, read without
torch (the launcher checks it before anything is submitted)."""

from __future__ import annotations

from pipeline.config import ParallelConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths

LAYOUT_KEYS = ("tensor", "pipeline", "virtual_pipeline")


def tracked_state(paths: RunPaths) -> dict | None:
    """state.json of the checkpoint latest.txt names, if any."""
    tracker = paths.checkpoint_tracker
    if not tracker.is_file():
        return None
    return files.read_json_or_none(paths.checkpoints / tracker.read_text().strip() / "state.json")


def layout_problem(saved: dict | None, parallel: ParallelConfig) -> tuple[str, str] | None:
    """(key, why) when a CPU run cannot resume from a checkpoint saved under the parallel
    layout `saved` (its state.json's "layout"): the CPU optimizer's state belongs to the shard
    each rank held."""
    if not saved:
        return None
    differ = [k for k in LAYOUT_KEYS if saved[k] != getattr(parallel, k)]
    if not differ:
        return None
    described = ", ".join(f"parallel.{k}={saved[k]}" for k in LAYOUT_KEYS)
    return f"parallel.{differ[0]}", (
        f"the checkpoint to resume was saved under {described}; on CPU, training resumes only "
        "under the layout it saved (its weights load under any: stages=[evaluate])"
    )
