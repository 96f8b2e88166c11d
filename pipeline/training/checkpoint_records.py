"""The checkpoints folder's records, read without torch (the launcher reads them before
anything is submitted): the newest complete checkpoint and its state, the checkpoint that
eval.checkpoint names, and whether a CPU run can resume under another parallel layout."""

from __future__ import annotations

from pipeline.config import ParallelConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths

LAYOUT_KEYS = ("tensor", "pipeline", "virtual_pipeline")


def tracked_state(paths: RunPaths) -> dict | None:
    """state.json of the newest checkpoint: the one latest.txt names, else (that one deleted,
    say) the newest folder with a readable one. Not verified here: a resume verifies what it
    reads."""
    tracker = paths.checkpoint_tracker
    named = [paths.checkpoints / tracker.read_text().strip()] if tracker.is_file() else []
    for folder in [*named, *sorted(paths.checkpoints.glob("iter_???????"), reverse=True)]:
        try:
            state = files.read_json_or_none(folder / "state.json")
        except ValueError:  # damaged: the resume skips it too
            continue
        if state is not None:
            return state
    return None


def chosen(paths: RunPaths, choice: str) -> str | None:
    """The checkpoint eval.checkpoint names, by its records (best.json, latest.txt) or as
    given; None when there is none yet. The evaluation verifies it before reading it."""
    if choice not in ("best", "latest"):
        return choice
    best = files.read_json_or_none(paths.best_checkpoint_record) if choice == "best" else None
    if best is not None:
        return best["name"]
    tracker = paths.checkpoint_tracker
    return tracker.read_text().strip() if tracker.is_file() else None


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
