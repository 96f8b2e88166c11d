"""Signals asking training to save and stop: a warning before the time limit (requeue), or
SIGTERM (scancel, preemption: stay stopped). Every rank acts on one at the same step."""

from __future__ import annotations

import signal

import torch

from pipeline.runtime import distributed


class StopRequest:
    """A warning signal before the time limit (SIGUSR1 or SIGUSR2, as the job asked Slurm for)
    or SIGTERM (scancel, preemption) asks the run to save and exit; every rank acts on it at
    the same step boundary, once any rank has it. The handler only sets a flag, so it replaces
    the launcher's own handlers (which would exit mid-step)."""

    WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)
    SIGNALS = (*WARNINGS, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: set[int] = set()
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received.add(signum)

    def ignore_warnings(self) -> None:
        """The run is over: a time-limit warning from now on (the job ending near its limit)
        has nothing left to save. Ignored, it cannot kill the exiting process once Python has
        put the default handlers back, which Slurm would count as a failed job and so never
        start the evaluation chained after it."""
        for sig in self.WARNINGS:
            signal.signal(sig, signal.SIG_IGN)

    def agreed(self, device: torch.device) -> bool:
        return distributed.any_rank(bool(self.received), device)

    def continues(self, device: torch.device) -> bool:
        """Whether the run should come back by itself: a time-limit warning, and no SIGTERM, on
        any rank. SIGTERM is someone's scancel, which must stick, or preemption, after which
        Slurm requeues the job itself."""
        warned = distributed.any_rank(bool(self.received & set(self.WARNINGS)), device)
        return warned and not distributed.any_rank(signal.SIGTERM in self.received, device)
