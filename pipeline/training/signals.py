"""Signals asking training to save and stop: a warning before the time limit (requeue), or
SIGTERM (scancel, preemption: stay stopped) or SIGINT (Ctrl-C, the same; a second one stops
at once, without the save). Every rank acts on one at the same step.

A training job records them from its first moment (`listen`): Slurm may send the time-limit
warning up to a minute earlier than asked (the resolution of its event handling), while the
job is still importing torch, and a signal nobody records there kills the job. Imports no
torch, so it can listen before torch is imported.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from pipeline.runtime import distributed

if TYPE_CHECKING:
    import torch

WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)  # the time-limit warning, as the job asked for it
STOPS = (signal.SIGTERM, signal.SIGINT)  # someone stopping the run: save, and stay stopped
SIGNALS = (*WARNINGS, *STOPS)
_received: set[int] = set()
_before: dict[int, object] = {}  # the stop signals' handlers before training listened


def _record(signum, frame) -> None:
    if signum == signal.SIGINT and signum in _received:
        raise KeyboardInterrupt  # Ctrl-C again: the user will not wait for the save
    _received.add(signum)


def listen() -> None:
    """From now on, record the stop signals in this process instead of dying of them. The
    handler only sets a flag, so it replaces the launcher's own (which would exit mid-step)."""
    for sig in SIGNALS:
        previous = signal.signal(sig, _record)
        if sig in STOPS and previous is not _record:
            _before[sig] = previous


class StopRequest:
    """Whether to stop, and to come back, at a step boundary: every rank acts on a signal once
    any rank has it. Listens from its creation on (and keeps what `listen` recorded before)."""

    def __init__(self) -> None:
        listen()

    @property
    def received(self) -> set[int]:
        return _received

    def ignore_warnings(self) -> None:
        """The run is over: a time-limit warning from now on (the job ending near its limit)
        has nothing left to save. Ignored, it cannot kill the exiting process once Python has
        put the default handlers back, which Slurm would count as a failed job and so never
        start the evaluation chained after it. Ctrl-C and SIGTERM interrupt again from now on."""
        for sig in WARNINGS:
            signal.signal(sig, signal.SIG_IGN)
        # Ctrl-C and SIGTERM stop what comes after (an evaluation in the same process) as
        # they did before training
        signal.signal(signal.SIGINT, _before.get(signal.SIGINT, signal.default_int_handler))
        signal.signal(signal.SIGTERM, _before.get(signal.SIGTERM, signal.SIG_DFL))

    def agreed(self, device: torch.device) -> bool:
        return distributed.any_rank(bool(_received), device)

    def continues(self, device: torch.device) -> bool:
        """Whether the run should come back by itself: a time-limit warning, and no SIGTERM or
        SIGINT, on any rank. SIGTERM is someone's scancel, which must stick, or preemption,
        after which Slurm requeues the job itself; SIGINT someone's Ctrl-C."""
        warned = distributed.any_rank(bool(_received & set(WARNINGS)), device)
        return warned and not distributed.any_rank(bool(_received & set(STOPS)), device)
