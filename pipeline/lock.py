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


class RunLocked(RuntimeError):
    pass


@contextmanager
def run_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "pipeline.lock"
    handle = open(path, "a+")  # noqa: SIM115 (held open for the lock's lifetime)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "{}"
        handle.close()
        info = json.loads(holder)
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
        handle.close()  # closing releases the lock
