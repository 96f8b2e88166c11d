"""Retention (train.keep_last): which checkpoint folders stay, and deleting the others. No
torch: the unit tests and the launcher read it."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from pipeline.core import files
from pipeline.core.paths import BEST_CHECKPOINT as BEST
from pipeline.training import leases

NAME = re.compile(r"iter_\d{7}")  # a finished checkpoint; .partial and .deleting ones are not


def folder_name(step: int) -> str:
    return f"iter_{step:07d}"


def discard(folder: Path, workdir: Path) -> None:
    """Delete a checkpoint folder: renamed first, so a kill midway leaves no half-deleted
    folder under a checkpoint's name. Links, and folders outside the run, are left alone."""
    if not files.owned_folder(folder, workdir):
        warnings.warn(f"not deleting {folder}: it leads outside {workdir}", stacklevel=2)
        return
    doomed = folder.with_name(folder.name + ".deleting")
    folder.rename(doomed)
    files.remove_tree(doomed, workdir)


def finished(root: Path) -> list[Path]:
    """The checkpoint folders under `root` by step, without .partial and .deleting ones."""
    return sorted(p for p in root.glob("iter_*") if NAME.fullmatch(p.name))


def apply(root: Path, keep_last: int) -> None:
    """Delete the checkpoints beyond the newest `keep_last`, but the best and those a live
    scoring job holds a lease on (pipeline.training.leases)."""
    workdir = root.parent
    best = files.read_json_or_none(root / BEST)
    keep = {best["name"]} if best else set()
    done = finished(root)
    keep.update(p.name for p in done[-keep_last:])
    for path in done:
        if path.name not in keep and leases.holder(path) is None:
            discard(path, workdir)
    for path in root.glob("iter_*.*"):  # left by saves or deletions that were killed
        files.remove_tree(path, workdir)
