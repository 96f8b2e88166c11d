"""Each training rank says what it is doing: its phase (start, load, data, forward-backward,
optimizer, validate, save) and step, with the wall time it entered it, in one small file of its
own under train/progress/. The hang watchdog (pipeline.resilience.watchdog), a process apart,
reads these files; a rank stuck anywhere, in a collective included, stops updating its own.

Cheap enough for every phase of every step: one pwrite of a fixed-size line into a file kept
open (the page cache; no collective, no fsync, nothing read back).

A rank also dumps every thread's Python stack to its log (stderr) on STACKS_SIGNAL, from
faulthandler's C handler, which runs even while the rank is blocked in C code.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.runtime.placement import node_name

STACKS_SIGNAL = signal.SIGRTMIN + 3  # not SIGUSR1/2: Slurm's time-limit warning uses those
RECORD_BYTES = 160
PHASES = ("start", "load", "data", "forward-backward", "optimizer", "validate", "save", "finish")
SLOW_PHASES = (
    "start",
    "load",
    "validate",
    "save",
    "finish",
)  # the watchdog gives these a start-up bound


@dataclass(frozen=True)
class Progress:
    """A rank's last report, as the watchdog reads it."""

    at: float  # time.time() when the rank entered the phase
    step: int
    phase: str
    step_s: float  # the rank's slowest step of this attempt so far (0: none measured yet)
    pid: int
    node: str
    rank: int
    save_s: float = 0.0  # the rank's slowest checkpoint save of this attempt (0: none yet)

    @classmethod
    def parse(cls, text: str, rank: int) -> Progress | None:
        fields = text.split("\n", 1)[0].split()  # a longer line written before may trail
        if len(fields) not in (6, 7):  # 6: written before saves were reported
            return None  # not written yet
        at, step, phase, step_s, pid, node, *save_s = fields
        saves = float(save_s[0]) if save_s else 0.0
        return cls(float(at), int(step), phase, float(step_s), int(pid), node, rank, saves)


class Reporter:
    """This rank's progress file, kept open."""

    def __init__(self, folder: Path, rank: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(folder / f"rank-{rank}", os.O_RDWR | os.O_CREAT, 0o666)
        self.pid, self.node = os.getpid(), node_name()
        self.step, self.slowest_step_s, self.slowest_save_s = 0, 0.0, 0.0

    def phase(self, name: str, step: int | None = None) -> None:
        if step is not None:
            self.step = step
        line = (
            f"{time.time():.3f} {self.step} {name} {self.slowest_step_s:.3f} {self.pid} "
            f"{self.node} {self.slowest_save_s:.3f}"
        )
        os.pwrite(self.fd, line.ljust(RECORD_BYTES - 1).encode() + b"\n", 0)

    def step_took(self, seconds: float) -> None:
        self.slowest_step_s = max(self.slowest_step_s, seconds)

    def save_took(self, seconds: float) -> None:
        self.slowest_save_s = max(self.slowest_save_s, seconds)


_reporter: Reporter | None = None


def start(folder: Path, rank: int) -> None:
    """This process is training rank `rank`: report from now on, and dump stacks on request."""
    global _reporter
    _reporter = Reporter(folder, rank)
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    _reporter.phase("start")


def phase(name: str, step: int | None = None) -> None:
    """Entering `name` (at `step`, or the step reported last); nothing when not reporting."""
    if _reporter is not None:
        _reporter.phase(name, step)


def reported_step() -> int | None:
    """The step this rank reported last; None: not reporting."""
    return _reporter.step if _reporter is not None else None


def step_took(seconds: float) -> None:
    if _reporter is not None:
        _reporter.step_took(seconds)


def save_took(seconds: float) -> None:
    """A checkpoint save took `seconds`, start to complete: the watchdog bounds saves by it."""
    if _reporter is not None:
        _reporter.save_took(seconds)


def reporting(batches: Iterator) -> Iterator:
    """`batches`, reporting "data" while the next one is read, "forward-backward" after."""
    if _reporter is None:
        yield from batches
        return
    while True:
        _reporter.phase("data")
        try:
            batch = next(batches)
        except StopIteration:
            return
        _reporter.phase("forward-backward")
        yield batch


def read(folder: Path) -> list[Progress]:
    """Every rank's last report under `folder`."""
    found = []
    for path in folder.glob("rank-*"):
        try:
            parsed = Progress.parse(path.read_text(), int(path.name.split("-", 1)[1]))
        except (OSError, ValueError):
            continue
        if parsed is not None:
            found.append(parsed)
    return sorted(found, key=lambda p: p.rank)
