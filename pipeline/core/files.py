"""Atomic writes and completion markers: nothing half-written is ever read.

Every output goes to a temporary name in the same folder, is fsynced, then renamed into place;
a stage marks itself complete last, so a rerun trusts a marker and redoes anything without one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import OutOfSpace

# A write that fails with one of these ran out of room: disk full, quota, or file-size limit.
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask, read without changing it (Linux reports it in /proc; elsewhere
    it is set and put back at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync it and rename it to `path`. The
    file gets the permissions a plain open() would give it under the user's umask (mkstemp
    makes it private)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.fchmod(fd, 0o666 & ~umask())
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


def space_error(error: BaseException | None) -> OSError | None:
    """The out-of-space OSError behind `error` (itself or what it was raised from), if any:
    torch's writers, for one, wrap it in a RuntimeError."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in SPACE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def out_of_space_failure(cause: OSError, what: str) -> str:
    return f"no space left writing {what}: {cause.strerror} ({errno.errorcode[cause.errno]})"


def out_of_space_message(cause: OSError, what: str) -> str:
    return (
        f"{out_of_space_failure(cause, what)}; free space (or raise the quota or file-size "
        "limit) and rerun the same command: complete outputs are kept"
    )


def probe_space(folder: Path) -> OSError | None:
    """Whether a write in `folder` fails for lack of space now, found by trying one. Writers
    that report a short write without its errno (torch's zip writer: "unexpected pos", from
    megatron-core's checkpoint workers) leave this the only way to tell: one byte past the
    largest file there meets a file-size limit, a block of 1 MiB a full disk or quota."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    probe = folder / ".space-probe"
    try:
        with open(probe, "wb") as f:
            f.seek(max(sizes, default=0))
            f.write(b"\0")
            f.flush()
            f.write(bytes(1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return e if e.errno in SPACE_ERRNOS else None
    finally:
        probe.unlink(missing_ok=True)
    return None


@contextlib.contextmanager
def reporting_space(what: str, probe: Path | None = None) -> Iterator[None]:
    """Turn running out of space while writing `what` into one clear OutOfSpace error; `probe`:
    the folder being written, tried when the error does not say why."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # torch's CheckpointException is a BaseException
        cause = space_error(e) or (probe_space(probe) if probe is not None else None)
        if cause is None:
            raise
        message = out_of_space_message(cause, what)
        raise OutOfSpace(message, out_of_space_failure(cause, what)) from e


def owned_folder(path: Path, boundary: Path) -> bool:
    """`path` is a real folder (not a link) whose real location is inside `boundary`: the only
    kind that cleanup may delete, so it never reaches outside the run folder."""
    inside = path.resolve().is_relative_to(boundary.resolve())
    return path.is_dir() and not path.is_symlink() and inside


def remove_tree(path: Path, boundary: Path) -> bool:
    """Delete the folder `path` if it is an owned_folder of `boundary`; returns whether it did."""
    if not owned_folder(path, boundary):
        return False
    shutil.rmtree(path)
    return True
