"""Checkpoints: save, find the latest valid one, keep the best by validation loss, retention.

checkpoints/iter_0000200/ holds the backend's weights and optimizer files, every rank's RNG
state, state.json (step, data position, scheduler, losses) and, written last, COMPLETE.json
listing each file with its size and the sha256 of each 128 MiB block of it, which the rank
that wrote a file computes right after writing it (blocks: a large file is hashed, and verified,
by many threads at once). A save is written as iter_0000200.partial/ and renamed once complete on every
rank (pipeline.training.saver writes it in the background); a folder whose files do not match
its COMPLETE.json (killed mid-save, truncated, altered) is never loaded, and weights that are
not finite are never saved. `latest.txt` names the newest complete checkpoint, written after
it; `best.json` the one with the lowest validation loss. Retention never deletes the best, nor
anything outside the run folder.
"""

from __future__ import annotations

import hashlib
import os
import random
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.core import files, scores
from pipeline.core.errors import ConfigError, NonFinite
from pipeline.core.paths import BEST_CHECKPOINT as BEST
from pipeline.core.paths import CHECKPOINT_TRACKER as TRACKER
from pipeline.core.paths import RunPaths
from pipeline.model.dist_checkpoint import FOLDER
from pipeline.runtime import distributed
from pipeline.training import retention
from pipeline.training.retention import finished, folder_name


def _listing(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "COMPLETE.json"
    }


def _checksums(
    folder: Path, names: list[str], block: int, collective: bool = False
) -> dict[str, list[str]]:
    """The digests of each `block` bytes of each file. With `collective` every rank of the job
    calls it and hashes its own share of the files, so a checkpoint of many ranks is read once,
    in parallel, not once by rank 0 alone."""
    shared = collective and dist.is_initialized() and dist.get_world_size() > 1
    share = names[dist.get_rank() :: dist.get_world_size()] if shared else names
    mine = block_digests(folder, share, block)
    if not shared:
        return mine
    shares: list[dict[str, list[str]]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(shares, mine)
    return {name: digest for part in shares for name, digest in part.items()}


def problem(folder: Path, checksums: bool = True, collective: bool = False) -> str | None:
    """Why `folder` is not a loadable checkpoint, or None if it is: COMPLETE.json is there and
    every file it lists has its recorded size and (with `checksums`) its recorded digests.
    `collective`: every rank calls it for the same folder (see _checksums)."""
    try:
        complete = files.read_json_or_none(folder / "COMPLETE.json")
    except ValueError:
        return "COMPLETE.json is damaged"
    if complete is None:
        return "no COMPLETE.json: the save did not finish"
    listing = _listing(folder)
    for name, size in complete["files"].items():
        if name not in listing:
            return f"{name} is missing"
        if listing[name] != size:
            return f"{name} has {listing[name]} bytes, {size} when saved"
    if not checksums:
        return None
    recorded = complete.get("sha256_blocks", {})
    block = complete.get("block_bytes", BLOCK_BYTES)
    for name, digests in _checksums(folder, sorted(recorded), block, collective).items():
        if digests != recorded[name]:
            return f"{name} does not match its sha256 when saved"
    whole = complete.get("sha256", {})  # saves of 0.3.0 and before: one digest per file
    for name in sorted(whole):
        if files.sha256(folder / name) != whole[name]:
            return f"{name} does not match its sha256 when saved"
    return None


def is_valid(folder: Path, checksums: bool = True) -> bool:
    return problem(folder, checksums) is None


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


def require_finite(chunks, step: int) -> None:
    """Collective: raise NonFinite on every rank if any rank's weights hold a NaN or inf."""
    named = [(name, p) for chunk in chunks for name, p in chunk.named_parameters()]
    finite = torch.stack([torch.isfinite(p).all() for _, p in named])
    bad = None if bool(finite.all()) else named[int((~finite).nonzero()[0])][0]
    if distributed.any_rank(bad is not None, finite.device):
        raise NonFinite(
            f"step {step}: the weights are not finite ({bad or 'on another rank'}); no "
            "checkpoint written, the earlier ones are kept: lower train.lr or check the data"
        )


DIGESTS = "digests"  # inside a checkpoint being written: each rank's checksums of its files


def begin(root: Path, step: int, chunks) -> Path:
    """Collective: the empty folder a save of `step` is written into, `iter_N.partial`.
    Refuses weights that are not finite."""
    require_finite(chunks, step)
    partial = root / f"{folder_name(step)}.partial"
    if _rank() == 0:
        files.remove_tree(partial, root.parent)  # from an earlier attempt that was killed
        partial.mkdir(parents=True)
    _barrier()
    return partial


def write_small_files(partial: Path, state: dict) -> None:
    """This rank's RNG state and (rank 0) state.json, as they are now."""
    with open(partial / f"rng_rank{_rank():05d}.pt", "wb") as f:  # a file: errors keep errno
        torch.save(rng_state(), f)
    if _rank() == 0:
        files.write_json(partial / "state.json", state)


def record_digests(partial: Path, rank: int) -> None:
    """The block digests of the tensor files rank `rank` wrote (torch's distributed checkpoint
    names them __RANK_N.distcp), computed by the process that wrote them, right after: the
    checkpoint is never read back for them, by one rank, while training waits."""
    names = sorted(f"{FOLDER}/{p.name}" for p in (partial / FOLDER).glob(f"__{rank}_*.distcp"))
    (partial / DIGESTS).mkdir(exist_ok=True)
    files.write_json(partial / DIGESTS / f"rank{rank:05d}.json", block_digests(partial, names))


BLOCK_BYTES = 1 << 27


def block_digests(folder: Path, names: list[str], block: int = BLOCK_BYTES) -> dict[str, list[str]]:
    """The sha256 of each `block` bytes of each file (one digest, of nothing, for an empty
    file), many blocks at once: hashlib releases the GIL on large reads."""
    blocks = [
        (name, index)
        for name in names
        for index in range(max(1, -(-(folder / name).stat().st_size // block)))
    ]
    with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        hashed = pool.map(lambda b: _block_digest(folder / b[0], b[1] * block, block), blocks)
        digests: dict[str, list[str]] = {name: [] for name in names}
        for (name, _), digest in zip(blocks, hashed, strict=True):
            digests[name].append(digest)
    return digests


def _block_digest(path: Path, start: int, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = size
        while left and (data := f.read(min(left, 1 << 23))):
            digest.update(data)
            left -= len(data)
    return digest.hexdigest()


def complete(root: Path, partial: Path, step: int, state: dict, keep_last: int) -> Path:
    """Collective, once every rank has written its files and their digests: COMPLETE.json
    (every file's size and block digests; rank 0 hashes the small files no rank recorded), then the
    rename to iter_N, latest.txt, best.json and retention. Returns the checkpoint folder."""
    _barrier()
    final = root / folder_name(step)
    if _rank() == 0:
        digests: dict[str, list[str]] = {}
        for record in sorted((partial / DIGESTS).glob("rank*.json")):
            digests.update(files.read_json(record))
        files.remove_tree(partial / DIGESTS, root.parent)
        sizes = _listing(partial)
        digests.update(block_digests(partial, sorted(set(sizes) - set(digests))))
        for path in partial.rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        complete = {
            "step": step,
            "files": sizes,
            "block_bytes": BLOCK_BYTES,
            "sha256_blocks": {n: digests[n] for n in sizes},
        }
        files.write_json(partial / "COMPLETE.json", complete)
        if final.exists():  # a save of this step from an earlier attempt, since resumed from
            retention.discard(final, root.parent)
        partial.rename(final)
        files.fsync_dir(root)
        files.write_text(root / TRACKER, final.name + "\n")  # only ever names a whole save
        _update_best(root, final, state)
        retention.apply(root, keep_last)
    _barrier()
    return final


def abandon(partial: Path) -> None:
    """A save that failed (no space, a writer that died): its folder goes, the earlier
    checkpoints and latest.txt stay as they were."""
    if _rank() == 0:
        files.remove_tree(partial, partial.parent.parent)


def save(root: Path, step: int, state: dict, backend, chunks, optimizer, keep_last: int) -> Path:
    """Collective: every rank calls it; returns when the checkpoint is complete. Refuses
    weights that are not finite; a write that fails (no space) removes its partial folder and
    leaves the earlier checkpoints and latest.txt as they were."""
    partial = begin(root, step, chunks)
    try:
        with files.reporting_space(f"checkpoint {partial}", probe=partial):
            backend.save(partial, chunks, optimizer, asynchronous=False)
            write_small_files(partial, state)
            record_digests(partial, _rank())
            return complete(root, partial, step, state, keep_last)
    except BaseException:
        abandon(partial)
        raise


def _update_best(root: Path, folder: Path, state: dict) -> None:
    val = state.get("val_loss")
    if val is None:
        return
    best = files.read_json_or_none(root / BEST)
    stale = best is None or not is_valid(root / best["name"], checksums=False)
    if stale or val < best["val_loss"]:
        files.write_json(root / BEST, {"name": folder.name, "step": state["step"], "val_loss": val})


def latest(root: Path, checksums: bool = True, collective: bool = False) -> Path | None:
    """The newest valid checkpoint; damaged or incomplete ones are skipped with a warning.
    `collective`: every rank calls it and shares the reading (see _checksums)."""
    for folder in reversed(finished(root)):
        reason = problem(folder, checksums, collective)
        if reason is None:
            return folder
        warnings.warn(
            f"skipping checkpoint {folder}: incomplete or damaged ({reason})", stacklevel=2
        )
    return None


def best(root: Path, checksums: bool = True) -> Path | None:
    record = files.read_json_or_none(root / BEST)
    if record and is_valid(root / record["name"], checksums):
        return root / record["name"]
    return latest(root, checksums)


def verified(root: Path, choice: str, select_by: str | None = None) -> Path:
    """The valid checkpoint that eval.checkpoint=`choice` names (best, latest or a folder), or
    a ConfigError saying, in one line, why there is none. With `select_by` (eval.select_by),
    best is the scored checkpoint with the best value of that task's metric."""
    if choice == "best" and select_by:
        return _best_scored(root, select_by)
    if choice in ("best", "latest"):  # each returns a verified checkpoint, or None
        folder = {"best": best, "latest": latest}[choice](root)
        if folder is None:
            raise ConfigError(f"eval.checkpoint={choice}: no valid checkpoint under {root}")
        return folder.resolve()
    folder = Path(choice).expanduser()
    key = "eval.checkpoint"
    if not folder.exists():
        raise ConfigError(f"{key}: {choice} does not exist")
    if not folder.is_dir():
        raise ConfigError(f"{key}: {choice} is a file; give a checkpoint folder, best or latest")
    inside = finished(folder)
    if inside:
        raise ConfigError(
            f"{key}: {choice} is a folder of checkpoints; give one of them ({inside[-1]}), "
            "best or latest"
        )
    why = problem(folder)
    if why is not None:
        raise ConfigError(f"{key}: {choice} is not a whole, valid checkpoint ({why})")
    return folder.resolve()


def _best_scored(root: Path, select_by: str) -> Path:
    name = scores.best(RunPaths(root.parent), select_by)
    if name is None:
        raise ConfigError(
            f"eval.select_by={select_by}: no checkpoint under {root} was scored on it (the "
            "downstream step scores the last one; eval.harness_every scores more)"
        )
    why = problem(root / name)
    if why is not None:
        raise ConfigError(f"eval.select_by={select_by}: {root / name} is not valid ({why})")
    return (root / name).resolve()


def load(folder: Path, backend, chunks, optimizer) -> dict:
    """Collective: load weights (and optimizer) into place; returns state.json."""
    backend.load(folder, chunks, optimizer)
    rng = folder / f"rng_rank{_rank():05d}.pt"
    if rng.exists():
        set_rng_state(torch.load(rng, weights_only=False))
    return files.read_json(folder / "state.json")
