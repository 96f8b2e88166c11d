"""Checkpoints: save, find the latest valid one, keep the best by validation loss, retention.

checkpoints/iter_0000200/ holds the backend's weights and optimizer files, every rank's RNG
state, state.json (step, data position, scheduler, losses) and, written last, COMPLETE.json
listing each file with its size. A folder without a matching COMPLETE.json is never loaded.
`latest.txt` names the newest complete checkpoint and `best.json` the one with the lowest
validation loss; retention never deletes the best.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline import files

TRACKER = "latest.txt"
BEST = "best.json"


def folder_name(step: int) -> str:
    return f"iter_{step:07d}"


def _listing(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "COMPLETE.json"
    }


def is_valid(folder: Path) -> bool:
    """Complete and unaltered in size: every file COMPLETE.json lists is there, same size."""
    complete = files.read_json_or_none(folder / "COMPLETE.json")
    if complete is None:
        return False
    listing = _listing(folder)
    return all(listing.get(name) == size for name, size in complete["files"].items())


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        from megatron.core import tensor_parallel

        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save(root: Path, step: int, state: dict, backend, chunks, optimizer, keep_last: int) -> Path:
    """Collective: every rank calls it. Returns the checkpoint folder."""
    final = root / folder_name(step)
    partial = root / f"{folder_name(step)}.partial"
    if _rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier()
    backend.save(partial, chunks, optimizer)
    torch.save(rng_state(), partial / f"rng_rank{_rank():05d}.pt")
    _barrier()
    if _rank() == 0:
        files.write_json(partial / "state.json", state)
        for path in partial.rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        files.write_json(partial / "COMPLETE.json", {"step": step, "files": _listing(partial)})
        if final.exists():  # a save of this step from an earlier, interrupted attempt
            shutil.rmtree(final)
        partial.rename(final)
        files.fsync_dir(root)
        files.write_text(root / TRACKER, final.name + "\n")
        _update_best(root, final, state)
        _apply_retention(root, keep_last)
    _barrier()
    return final


def _update_best(root: Path, folder: Path, state: dict) -> None:
    val = state.get("val_loss")
    if val is None:
        return
    best = files.read_json_or_none(root / BEST)
    if best is None or val < best["val_loss"] or not is_valid(root / best["name"]):
        files.write_json(root / BEST, {"name": folder.name, "step": state["step"], "val_loss": val})


def _apply_retention(root: Path, keep_last: int) -> None:
    best = files.read_json_or_none(root / BEST)
    keep = {best["name"]} if best else set()
    complete = [p for p in sorted(root.glob("iter_*")) if not p.name.endswith(".partial")]
    keep.update(p.name for p in complete[-keep_last:])
    for path in complete:
        # only our own folders directly under root are ever deleted
        if path.name not in keep and path.parent == root and path.is_dir():
            shutil.rmtree(path)


def latest(root: Path) -> Path | None:
    """The newest valid checkpoint; damaged or incomplete ones are skipped with a warning."""
    for folder in sorted(root.glob("iter_*"), reverse=True):
        if folder.name.endswith(".partial"):
            continue
        if is_valid(folder):
            return folder
        warnings.warn(f"skipping checkpoint {folder}: incomplete or damaged", stacklevel=2)
    return None


def best(root: Path) -> Path | None:
    record = files.read_json_or_none(root / BEST)
    if record and is_valid(root / record["name"]):
        return root / record["name"]
    return latest(root)


def load(folder: Path, backend, chunks, optimizer) -> dict:
    """Collective: load weights (and optimizer) into place; returns state.json."""
    backend.load(folder, chunks, optimizer)
    rng = folder / f"rng_rank{_rank():05d}.pt"
    if rng.exists():
        set_rng_state(torch.load(rng, weights_only=False))
    return files.read_json(folder / "state.json")
