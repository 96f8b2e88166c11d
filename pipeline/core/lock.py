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

from pipeline.core.errors import RunLocked
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


@contextmanager
def run_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    path = RunPaths(root).lock
    handle = open(path, "a+")  # noqa: SIM115 (held open for the lock's lifetime)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
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
                    "command": " ".join(sys.argv),
                }
            )
        )
        handle.flush()
        yield
    finally:
        handle.truncate(0)  # no record of a holder once it is done
        handle.close()  # closing releases the lock
