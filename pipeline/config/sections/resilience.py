"""Fault tolerance (resilience.*): hangs, stragglers, restarts in the allocation, requeues,
the Slurm warning before the time limit, saves that fail for space."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.keys import NOT_SETTING, command, key
from pipeline.config.rules import AT_LEAST_ONE, NOT_NEGATIVE, POSITIVE


@dataclass
class ResilienceConfig:
    """What pipeline.resilience and the training loop's checkpoint saver are bounded by."""

    hang_timeout_s: float | None = command(
        None,
        "a training rank without progress this long ends the attempt; none: 10x the slowest "
        "step (60 s at least, 900 s before the first step and in loads); a save gets 10x the "
        "slowest save once one is measured (900 s before); 0: off",
        rule=NOT_NEGATIVE,
    )
    straggler_threshold: float = command(
        0.1,
        "a rank whose own work per step exceeds the median's by this share is named",
        rule=POSITIVE,
    )
    max_restarts: int = command(
        3,
        "times a training job restarts its ranks in its allocation after a fault, from the "
        "newest checkpoint; then it requeues itself without the nodes at fault",
        rule=NOT_NEGATIVE,
        common=True,
    )
    spare_nodes: int = command(
        0,
        "nodes a training job holds beyond cluster.nodes, each to take a faulty node's place",
        rule=NOT_NEGATIVE,
        common=True,
    )
    # Settings replayed from the run's history, as before they moved here from train.*
    max_requeues: int = key(
        20, NOT_SETTING, "requeues at time limits and after faults", rule=NOT_NEGATIVE, common=True
    )
    exit_signal_lead_s: int = key(120, NOT_SETTING, "Slurm's warning before the time limit")
    max_failed_saves: int = key(
        3,
        NOT_SETTING,
        "saves in a row that may fail for space, skipped, before the run stops",
        rule=AT_LEAST_ONE,
    )
