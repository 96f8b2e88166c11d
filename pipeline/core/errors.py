"""Failures a user can act on. The command line reports them in one line, without a traceback:
the message says what happened, where, and what to do."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake in the configuration; the message starts with the key."""


class StageError(RuntimeError):
    """A stage stopped for a reason its message explains."""


class OutOfSpace(StageError):
    """A write failed for lack of space: disk full, quota, or file-size limit. `what`: the
    failure alone, for a caller that goes on (the message also says how to finish the run)."""

    def __init__(self, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.what = what or message


class NonFinite(StageError):
    """Training met a loss, gradient or weights that are NaN or infinite."""


class OutOfMemory(StageError):
    """A training step needed more memory than its device has: never retried, it would fail
    the same way."""


class RunLocked(RuntimeError):
    """Another launcher holds the run folder."""


class Terminated(BaseException):
    """SIGTERM outside training (a kill, a closing session): like Ctrl-C, it stops the command
    at once, everything whole kept. A BaseException, so that no `except Exception` takes it."""
