"""Stragglers: each rank's step time split into its own work and its waiting for the others
(the time inside torch.distributed's collectives, timed where they are called), gathered at
every log interval. A rank whose own work exceeds the median rank's by more than
resilience.straggler_threshold for STRAGGLING_INTERVALS intervals in a row is named, with its
node: it sets every step's pace while the others wait for it.

Collectives block on gloo (CPU ranks), so there the split is exact; on GPUs NCCL's return at
once and the waiting shows up where the host next waits for the device (reading the loss),
which is then counted as own work: the GPU figure is an upper bound on own work.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from pipeline.core import log

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "barrier",
    "all_to_all_single",
    "send",
    "recv",
)
STRAGGLING_INTERVALS = 3
_waited = [0.0]  # seconds this process spent inside collectives so far

_log = log.get()


def _timed(collective):
    @functools.wraps(collective)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return collective(*args, **kwargs)
        finally:
            _waited[0] += time.perf_counter() - started

    timed.timed = True
    return timed


def time_collectives() -> None:
    """From now on, time every collective called through torch.distributed."""
    for name in COLLECTIVES:
        collective = getattr(dist, name, None)
        if collective is not None and not getattr(collective, "timed", False):
            setattr(dist, name, _timed(collective))


class StragglerWatch:
    """Collective: every rank calls `interval` at the same log steps."""

    def __init__(self, threshold: float, device: torch.device) -> None:
        self.threshold, self.device = threshold, device
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.nodes = [None] * self.world
        if self.world > 1:
            from pipeline.runtime.placement import node_name

            dist.all_gather_object(self.nodes, node_name())
            time_collectives()
        self.slow_for = [0] * self.world
        self.waited = 0.0  # in this window's training steps

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around a training step: its collectives' time counts as waiting."""
        before = _waited[0]
        try:
            yield
        finally:
            self.waited += _waited[0] - before

    def interval(self, step: int, seconds: float) -> dict:
        """This window's split of every rank, and the stragglers named at this step."""
        if self.world == 1:
            return {}
        waited, self.waited = self.waited, 0.0
        f64 = {"dtype": torch.float64, "device": self.device}
        mine = torch.tensor([max(seconds - waited, 0.0), waited], **f64)
        every = [torch.zeros(2, **f64) for _ in range(self.world)]
        dist.all_gather(every, mine)
        work = [float(t[0]) for t in every]
        median = statistics.median(work)
        named = []
        for rank, own in enumerate(work):
            slow = median > 0 and own > median * (1 + self.threshold)
            self.slow_for[rank] = self.slow_for[rank] + 1 if slow else 0
            if self.slow_for[rank] == STRAGGLING_INTERVALS:
                named.append({"rank": rank, "node": self.nodes[rank], "ratio": own / median})
        for s in named:
            _log.info(
                f"straggler: rank {s['rank']} on {s['node']}, its own work {s['ratio']:.2f}x the "
                f"median rank's for {STRAGGLING_INTERVALS} log intervals in a row up to step "
                f"{step} (resilience.straggler_threshold={self.threshold:g})"
            )
        split = {"work_s": work, "wait_s": [float(t[1]) for t in every]}
        return {**split, "stragglers": named} if named else split
