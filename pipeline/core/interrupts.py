"""Ctrl-C and SIGTERM outside training, kept hold of. Python raises KeyboardInterrupt wherever
the main thread happens to be, and some places turn it into something else: a Ctrl-C that
lands while a C extension initialises on its first import (tqdm's, protobuf's, sentencepiece's,
imported as a tokenize task starts) fails that import with "ImportError: initialization
failed", which a library that falls back on ImportError swallows: the run went on and exited
0. So the signal is recorded as well as raised, and `check` raises it again at the next place
where stopping is safe (before each step and each task) and when the command ends."""

from __future__ import annotations

import signal

from pipeline.core.errors import Terminated

STOPS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []


def _stop(signum, frame) -> None:
    _received.append(signum)
    raise _exception(signum)


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def install() -> None:
    """Ctrl-C and SIGTERM, from now on, raise in this process and are recorded."""
    for sig in STOPS:
        signal.signal(sig, _stop)


def received() -> int | None:
    """The first stop signal received since `install`, if any."""
    return _received[0] if _received else None


def check() -> None:
    """Raise the stop a signal asked for, if one came, even if something swallowed it."""
    if _received:
        raise _exception(_received[0])


def settle() -> None:
    """The command is stopping: a later or still pending signal cannot interrupt its exit."""
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)
