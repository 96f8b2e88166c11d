"""Failures a user can act on. The launcher reports them in one line, without a traceback:
the message says what happened, where, and what to do."""

from __future__ import annotations


class StageError(RuntimeError):
    """A stage stopped for a reason its message explains."""


class OutOfSpace(StageError):
    """A write failed for lack of space: disk full, quota, or file-size limit."""


class NonFinite(StageError):
    """Training met a loss, gradient or weights that are NaN or infinite."""
