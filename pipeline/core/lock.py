"""One launcher per run folder: a second `make pretrain` on the same workdir refuses to start
and names the holder, so two writers never share a run."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import ConfigError, RunLocked
from pipeline.core.paths import RunPaths


def _alive(info: dict) -> bool:
    """The holder named in `info` may be running (only a process on this host can be checked)."""
    if info.get("host") != socket.gethostname():
        return True
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def _holder(handle) -> dict:
    """Who holds the lock. The holder writes this just after taking the lock, over what an
    earlier, killed holder left: a launcher that lost a race waits a moment for the record."""
    deadline = time.monotonic() + 5
    while True:
        handle.seek(0)
        try:
            info = json.loads(handle.read() or "null")
        except json.JSONDecodeError:  # being written
            info = None
        if isinstance(info, dict) and "pid" in info and _alive(info):
            return info
        if time.monotonic() > deadline:
            return info if isinstance(info, dict) else {}
        time.sleep(0.05)


def _take(handle, kind: int, tries: int = 1) -> bool:
    for attempt in range(tries):
        try:
            fcntl.flock(handle, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(0.1)
    return False


def holder(root: Path) -> dict | None:
    """Who holds the run folder's lock now ({pid, host, since, command}: a launcher running
    steps here), or None. Takes a shared lock for an instant to know, creating nothing."""
    try:
        handle = open(RunPaths(root).lock)  # noqa: SIM115 (closed below)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with handle:
        if _take(handle, fcntl.LOCK_SH):
            fcntl.flock(handle, fcntl.LOCK_UN)
            return None
        return _holder(handle)


@contextmanager
def run_lock(root: Path) -> Iterator[None]:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"workdir: cannot make {root}: {e.strerror}") from None
    path = RunPaths(root).lock
    handle = open(path, "a+")  # noqa: SIM115 (held open for the lock's lifetime)
    if not _take(handle, fcntl.LOCK_EX, tries=10):  # `holder` may hold it for an instant
        info = _holder(handle)
        handle.close()
        raise RunLocked(
            f"workdir {root} is in use by pid {info.get('pid')} on {info.get('host')} since "
            f"{info.get('since')} ({info.get('command')}); wait for it or use another workdir"
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "started": time.time(),  # to the sub-second: what came after it
                    "command": " ".join(sys.argv),
                }
            )
        )
        handle.flush()
        yield
    finally:
        handle.truncate(0)  # no record of a holder once it is done
        handle.close()  # closing releases the lock
