"""What a training job does about a fault (`decide`), and doing it (`act`): the record goes to
train/failures.jsonl, the job's supervisor restarts the ranks or the job is requeued.

A job the pipeline submitted has a supervisor (pipeline.resilience.supervisor), which restarts
the ranks inside the allocation: a node is set aside once it is implicated in a hang or a loss,
or in two crashes (one may be the software's); a spare node takes its place. With no spare
left or resilience.max_restarts spent in this allocation, the job puts itself back in the queue
without the nodes set aside, up to resilience.max_requeues times. Ranks started by a hand-written
sbatch script have none: their node's watchdog requeues the job without the nodes at fault,
up to resilience.max_restarts times (each requeue restarts the ranks).

Either way, a fault of the same kind at the same step as the one before it means the restart
made no progress: the run stops there, in one line, instead of looping. An out-of-memory, or a
rank that stopped the run on purpose, is never retried: it would end the same way. Elsewhere
(cluster.executor=subprocess) the attempt just ends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.resilience import records, scheduler
from pipeline.resilience.records import Action, Decision, FaultKind, FaultRecord

NOT_RETRIED = (FaultKind.OUT_OF_MEMORY, FaultKind.STOPPED)


@dataclass(frozen=True)
class Limits:
    max_restarts: int  # resilience.max_restarts
    max_requeues: int  # resilience.max_requeues


@dataclass(frozen=True)
class Allocation:
    """Where the job stands. `held`: its nodes now, when a supervisor can restart the ranks on
    them (None: a hand-written script's, which cannot); `partition`: the partition's nodes that
    are up (None: not known); `requeues`: how often Slurm requeued the job so far."""

    needed: int
    held: list[str] | None = None
    partition: set[str] | None = None
    requeues: int = 0


def no_progress(record: FaultRecord, before: list[FaultRecord]) -> str | None:
    """The stop line when `record` repeats the fault before it, at the same step."""
    last = before[-1] if before else None
    repeated = last and last.attempt < record.attempt and last.kind is record.kind
    if repeated and last.step == record.step:
        return (
            f"stopped: a {record.kind.value} at step {record.step} again after a restart, "
            "which made no progress"
        )
    return None


def implicated(record: FaultRecord, before: list[FaultRecord]) -> list[str]:
    """The nodes `record` sets aside: a hang's or a loss's at once, a crash's the second time."""
    if record.kind in (FaultKind.HANG, FaultKind.NODE_LOST):
        return sorted(record.nodes)
    crashes = [n for r in [*before, record] if r.kind is FaultKind.CRASH for n in r.nodes]
    return sorted(n for n in record.nodes if crashes.count(n) >= 2)


def decide(
    record: FaultRecord, before: list[FaultRecord], limits: Limits, where: Allocation
) -> Decision:
    """The action for `record` given this job's faults `before` it."""
    if record.job is None:
        return Decision(Action.ENDED, "ended the attempt")
    if record.kind in NOT_RETRIED:
        return Decision(Action.STOPPED, f"stopped, not retried: {record.line}")
    stop = no_progress(record, before)
    if stop:
        return Decision(Action.STOPPED, stop)
    if where.held is None:
        return _requeue_unsupervised(record, before, limits, where)
    return _restart_or_requeue(record, before, limits, where)


def _restart_or_requeue(
    record: FaultRecord, before: list[FaultRecord], limits: Limits, where: Allocation
) -> Decision:
    """A supervisor's: the ranks again on the nodes left, or the job requeued."""
    aside = implicated(record, before)
    excluded = {n for r in before for n in r.excluded or []} | set(aside)
    usable = [n for n in where.held or [] if n not in excluded]
    this_allocation = [r for r in before if r.allocation == record.allocation]
    restarts = sum(r.decision is Action.RESTARTED for r in this_allocation)
    without = f" without {','.join(aside)}" if aside else ""
    if restarts < limits.max_restarts and len(usable) >= where.needed:
        return Decision(Action.RESTARTED, f"restarted in the allocation{without}", aside)
    if where.requeues >= limits.max_requeues:
        said = f"stopped: {where.requeues} requeues reached resilience.max_requeues"
        return Decision(Action.STOPPED, said)
    if where.partition is not None and len(where.partition - excluded) < where.needed:
        said = f"stopped: the partition has fewer than {where.needed} nodes without those at fault"
        return Decision(Action.STOPPED, said)
    why = (
        "no spare node left"
        if restarts < limits.max_restarts
        else "resilience.max_restarts reached"
    )
    return Decision(Action.REQUEUED, f"requeued{without} ({why})", aside)


def _requeue_unsupervised(
    record: FaultRecord, before: list[FaultRecord], limits: Limits, where: Allocation
) -> Decision:
    """A hand-written script's watchdog: each restart is a requeue, without every node at fault
    in this job so far; only this fault's, when the partition would keep too few for that."""
    restarts = [r for r in before if r.decision is Action.REQUEUED]
    if len(restarts) >= limits.max_restarts:
        said = f"stopped: {len(restarts)} restarts reached resilience.max_restarts"
        return Decision(Action.STOPPED, said)
    for excluded in ({n for r in restarts for n in r.nodes} | set(record.nodes), set(record.nodes)):
        if where.partition is None or len(where.partition - excluded) >= where.needed:
            listed = sorted(excluded)
            return Decision(Action.REQUEUED, f"requeued without {','.join(listed)}", listed)
    said = (
        f"stopped: without {','.join(record.nodes)} the partition has fewer than the "
        f"{where.needed} nodes the job needs"
    )
    return Decision(Action.STOPPED, said)


def excluded_nodes(before: list[FaultRecord]) -> set[str]:
    """The nodes these faults have set aside."""
    return {n for r in before for n in r.excluded or []}


def recorded_since(failures: Path, job: str | None, attempt: int, since: float) -> bool:
    """Whether another node recorded a fault of this attempt since `since`."""
    for r in records.read(failures, job):
        at = time.mktime(time.strptime(r.time, "%Y-%m-%dT%H:%M:%S"))
        if r.attempt == attempt and at >= int(since):
            return True
    return False


def act(failures: Path, record: FaultRecord, limits: Limits, where: Allocation) -> Decision:
    """Decide, record and act: requeue the job when so decided (without every node set aside
    so far); saying it, restarting or stopping is the caller's."""
    before = records.read(failures, record.job)
    decision = decide(record, before, limits, where)
    record.decision, record.action = decision.action, decision.said
    if where.held is not None:  # what a supervisor sets aside stays aside for the job
        record.excluded = decision.aside
    records.append(failures, record)
    if decision.action is Action.REQUEUED and record.job:
        aside = decision.aside if where.held is None else sorted(excluded_nodes([*before, record]))
        if aside:
            scheduler.requeue_without(record.job, aside)
        else:
            scheduler.requeue(record.job)
    return decision
