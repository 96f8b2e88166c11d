"""Atomic writes and completion markers: nothing half-written is ever read.

Every output goes to a temporary name in the same folder, is fsynced, then renamed into place;
a stage marks itself complete last, so a rerun trusts a marker and redoes anything without one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync it and rename it to `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, target)
        fsync_dir(target.parent)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def read_json_or_none(path: str | os.PathLike) -> Any | None:
    """The JSON at `path`, or None when it is missing (a complete marker is never partial)."""
    try:
        return read_json(path)
    except FileNotFoundError:
        return None


def sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def publish(
    partial: str | os.PathLike, final: str | os.PathLike, suffixes: tuple[str, ...]
) -> None:
    """Make finished files visible: fsync PARTIAL+suffix, rename each to FINAL+suffix, fsync the
    folder. Readers only ever look at the final names."""
    for suffix in suffixes:
        with open(f"{partial}{suffix}", "rb+") as f:
            os.fsync(f.fileno())
        os.replace(f"{partial}{suffix}", f"{final}{suffix}")
    fsync_dir(Path(final).parent)
