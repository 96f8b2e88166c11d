"""The pipeline's messages on stderr: Python's logging, under the "pipeline" logger, with one
format, levels and a rank filter.

    log.get("pipeline").info("train: running")   ->  [pipeline] train: running
    log.get().info("index cache: 12 samples")     ->  index cache: 12 samples

A logger's tag (pipeline, plan, train) opens each of its lines in brackets, as the lines read
before there were levels. The level is INFO unless PIPELINE_LOG_LEVEL names another (DEBUG adds
the time, the level and the rank to each line); `-q` on a command line is WARNING. Child
processes and jobs inherit it through the environment. Lines of a training come from its
logging rank alone (`RankFilter`).
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "pipeline"
LEVEL = "PIPELINE_LOG_LEVEL"
QUIET = ("-q", "--quiet")


class _CurrentStderr(logging.StreamHandler):
    """Writes to sys.stderr as it is at each line (a test or a job may have replaced it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class RankFilter(logging.Filter):
    """Lines below the level (read at each line: a test or a command may set it late) are
    dropped, and so are the INFO lines of a training rank that is not the one that logs;
    warnings and errors come from every rank."""

    logs = True  # this process: set once by the training (one rank logs)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < level():
            return False
        return RankFilter.logs or record.levelno >= logging.WARNING


class _Format(logging.Formatter):
    """The one format: `[tag] message`; at DEBUG, the time, the level and the rank before."""

    def format(self, record: logging.LogRecord) -> str:
        tag = record.name[len(ROOT) + 1 :]
        line = f"[{tag}] {record.getMessage()}" if tag else record.getMessage()
        if level() <= logging.DEBUG:
            rank = os.environ.get("RANK", "-")
            line = f"{self.formatTime(record)} {record.levelname} rank={rank} {line}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def level() -> int:
    name = os.environ.get(LEVEL, "INFO").upper()
    value = logging.getLevelName(name)
    return value if isinstance(value, int) else logging.INFO


def _configure() -> logging.Logger:
    root = logging.getLogger(ROOT)
    if not root.handlers:
        handler = _CurrentStderr()
        handler.addFilter(RankFilter())
        handler.setFormatter(_Format())
        root.addHandler(handler)
        root.setLevel(logging.DEBUG)  # the handler's filter applies the level
        root.propagate = False  # Hydra's logging configures the root logger, not ours
    return root


def get(tag: str = "") -> logging.Logger:
    """The logger whose lines open with [tag]; "" for lines without one."""
    _configure()
    return logging.getLogger(f"{ROOT}.{tag}" if tag else ROOT)


def take_quiet(argv: list[str]) -> None:
    """`-q` / `--quiet` off a command line: warnings and errors only, in this process and
    those it starts."""
    if any(arg in QUIET for arg in argv):
        argv[:] = [arg for arg in argv if arg not in QUIET]
        os.environ[LEVEL] = "WARNING"
