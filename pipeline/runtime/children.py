"""Processes this one forks die with it. megatron-core writes checkpoints from forked worker
processes, and data loading can fork workers too: when a pipeline process is killed (kill -9,
the OOM killer, a node that goes away), such a child would otherwise live on, blocked on a
queue nobody reads, holding the run folder's lock and the launcher's output pipe."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_this_process() -> None:
    """From now on, every child forked by Python (multiprocessing, os.fork) gets SIGKILL when
    the thread that forked it ends (megatron-core and data loaders fork from the main thread).
    Linux only; elsewhere children keep the default."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    forking = [0]

    def before() -> None:
        forking[0] = os.getpid()

    def in_child() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != forking[0]:  # the parent died before the line above took effect
            os._exit(1)

    os.register_at_fork(before=before, after_in_child=in_child)
