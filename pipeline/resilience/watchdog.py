"""The hang watchdog: one process per node of a training job, started by the node's first rank
(pipeline.resilience.guard), apart from every rank so that none can block it. Once a second
it reads the node's ranks' progress (pipeline.resilience.progress); when one has made none for
longer than its limit it names, in one line, the rank(s), node(s) and phase that stopped,
has every rank of the node write its Python stack to its log, hands the fault to the job's
supervisor (or records and acts on it itself, pipeline.resilience.decisions), and ends the
attempt (SIGKILL to the node's ranks).

The limit: resilience.hang_timeout_s when set; unset, ten times the slowest step measured in
this attempt, at least a minute, and STARTUP_BOUND_S until a step has been measured. A save
gets at least ten times the slowest save the run has measured (this attempt's, or one in
train/metrics.jsonl), and STARTUP_BOUND_S until one is. Start-up, loading, validation and
finishing are allowed at least STARTUP_BOUND_S whatever the setting: they may legitimately
take minutes without a step.

    python -m pipeline.resilience.watchdog SETTINGS_JSON     (a WatchdogSettings)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.resilience import decisions, faults, scheduler
from pipeline.resilience.progress import SLOW_PHASES, STACKS_SIGNAL, Progress, read
from pipeline.resilience.records import FaultKind, FaultRecord

STARTUP_BOUND_S = 900.0
DERIVED_MIN_S = 60.0
DERIVED_STEPS = 10
SAVES = 10  # a save may take this many times the slowest one measured
POLL_S = 1.0
GRACE_S = 5.0  # for the node that sees the stopped rank to record the fault first
STACKS_WAIT_S = 3.0  # for every rank to have written its stack before it is killed

_log = log.get("watchdog")


@dataclass(frozen=True)
class WatchdogSettings:
    """What a node's watchdog is told as it starts."""

    workdir: str
    node: str
    parent_pid: int  # the node's first rank: the watchdog ends with it
    attempt: int
    timeout_s: float | None  # resilience.hang_timeout_s; None: derived from the steps
    supervised: bool  # the job's supervisor decides what to do about a hang; else this process
    max_restarts: int
    max_requeues: int
    job: str | None  # Slurm's job id, nodes and partition; None: not under Slurm
    job_nodes: int
    partition: str | None

    def to_argv(self) -> list[str]:
        return [sys.executable, "-m", "pipeline.resilience.watchdog", json.dumps(asdict(self))]

    @classmethod
    def from_argv(cls, argv: list[str]) -> WatchdogSettings:
        return cls(**json.loads(argv[0]))


def limit_s(report: Progress, timeout_s: float | None, recorded_save_s: float = 0.0) -> float:
    """How long `report`'s phase may last without another report; `recorded_save_s`: the
    slowest save in train/metrics.jsonl (earlier attempts')."""
    if timeout_s is None:
        measured = report.step_s > 0
        timeout_s = max(DERIVED_MIN_S, DERIVED_STEPS * report.step_s) if measured else None
    save_s = max(report.save_s, recorded_save_s)
    if report.phase == "save" and save_s > 0:
        return max(DERIVED_MIN_S if timeout_s is None else timeout_s, SAVES * save_s)
    if timeout_s is None or report.phase in SLOW_PHASES:
        return max(timeout_s or 0.0, STARTUP_BOUND_S)
    return timeout_s


def plan_line(timeout_s: float | None, paths: RunPaths) -> str | None:
    """The bounds, as the plan says them before a launch; None: no watchdog."""
    if timeout_s == 0:
        return None
    steps = (
        f"{timeout_s:g} s (resilience.hang_timeout_s)"
        if timeout_s is not None
        else f"{DERIVED_STEPS}x the slowest step, at least {DERIVED_MIN_S:.0f} s"
    )
    saved = recorded_save_s(paths)
    saves = (
        f"{max(timeout_s or DERIVED_MIN_S, SAVES * saved):.0f} s ({SAVES}x the slowest save "
        f"recorded, {saved:.1f} s), or {SAVES}x a slower one measured"
        if saved
        else f"{STARTUP_BOUND_S:.0f} s until one is measured, then {SAVES}x the slowest"
    )
    return (
        f"[plan] hang watchdog: a rank may make no progress for {steps} in a step; in a save "
        f"{saves}; start-up, loading and validation {STARTUP_BOUND_S:.0f} s"
    )


def recorded_save_s(paths: RunPaths) -> float:
    """The slowest checkpoint save train/metrics.jsonl records (0: none yet)."""
    try:
        lines = paths.metrics.read_text().splitlines()
    except OSError:
        return 0.0
    slowest = 0.0
    for line in lines:
        try:
            slowest = max(slowest, float(json.loads(line).get("checkpoint_total_s", 0.0)))
        except (ValueError, TypeError, AttributeError):
            continue  # a line cut short by a kill: the others still count
    return slowest


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (R, S, D, T...); None: gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state = stat.rsplit(")", 1)[1].split()[0]
    return None if state in ("Z", "X") else state


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_state(pid) is not None if sys.platform.startswith("linux") else True


def stalled(
    reports: list[Progress], timeout_s: float | None, now: float, saves_s: float = 0.0
) -> list[Progress]:
    return [r for r in reports if now - r.at > limit_s(r, timeout_s, saves_s) and alive(r.pid)]


def first_stopped(reports: list[Progress], node: str) -> list[Progress]:
    """The ranks that stopped: those whose process is stopped or stuck in I/O, as far as this
    node sees; else at the lowest step, the oldest reports (within a second). The others are
    waiting for them in a collective."""
    stuck = [r for r in reports if r.node == node and process_state(r.pid) in ("T", "D")]
    if stuck:
        return stuck
    lowest = min(r.step for r in reports)
    behind = [r for r in reports if r.step == lowest]
    oldest = min(r.at for r in behind)
    return [r for r in behind if r.at - oldest <= 1.0]


def describe(r: Progress, now: float, node: str) -> str:
    state = process_state(r.pid) if r.node == node else None
    how = (
        " (process stopped)"
        if state == "T"
        else " (process in uninterruptible I/O)"
        if state == "D"
        else ""
    )
    return (
        f"rank {r.rank} on {r.node} in {r.phase} of step {r.step + 1}, {now - r.at:.0f} s ago{how}"
    )


def dump_stacks(local: list[Progress]) -> None:
    """Every local rank writes its stack to its log; a stopped one is let run for the dump,
    then stopped again, so that it makes no progress meanwhile."""
    stopped = [r for r in local if process_state(r.pid) == "T"]
    for r in local:
        os.kill(r.pid, STACKS_SIGNAL)
    for r in stopped:
        os.kill(r.pid, signal.SIGCONT)
    time.sleep(0.2)
    for r in stopped:
        os.kill(r.pid, signal.SIGSTOP)
    time.sleep(STACKS_WAIT_S)


def act(
    local: list[Progress], everyone: list[Progress], settings: WatchdogSettings, saves_s: float
) -> None:
    """Name the ranks that stopped, dump the stacks, record and act, end the node's ranks. A
    node that sees one of its ranks stopped or stuck in I/O acts at once; the others wait a
    little for such a node's record, and only end their own ranks if one came."""
    paths, timeout_s = RunPaths.of(settings.workdir), settings.timeout_s
    node = local[0].node
    since = min(r.at for r in local)
    evidence = first_stopped(local, node)
    if not any(process_state(r.pid) in ("T", "D") for r in evidence):
        time.sleep(GRACE_S)
        failures, job, attempt = paths.failures_log, settings.job, settings.attempt
        recorded = decisions.recorded_since(failures, job, attempt, since)
        if recorded or faults.found_since(paths.progress, since):
            _log.error(f"hang: ranks on {node} waited for another node's; ending them")
            dump_stacks(local)
            end(local)
            return
    now = time.time()
    culprits = first_stopped(everyone or local, node)
    waiting = [r for r in everyone if r not in culprits]
    limit = max(limit_s(r, timeout_s, saves_s) for r in culprits)
    setting = f"resilience.hang_timeout_s={timeout_s:g}" if timeout_s is not None else "derived"
    slowest_save = max([saves_s, *(r.save_s for r in culprits)])
    if culprits[0].phase == "save" and slowest_save > 0 and limit == SAVES * slowest_save:
        setting = f"{SAVES}x the slowest save, {slowest_save:.1f} s"
    line = (
        f"hang: no progress for {limit:.0f} s ({setting}): "
        + "; ".join(describe(r, now, node) for r in culprits)
        + (f"; {len(waiting)} other rank(s) waiting for it" if waiting else "")
        + "; their stacks follow in each rank's log, ending the attempt"
    )
    _log.error(line)
    step = min(r.step for r in culprits)
    lost = max(0, step - faults.checkpoint_step(paths))
    computed = lost * max(r.step_s for r in culprits)  # the steps to do again
    record = FaultRecord(
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
        attempt=settings.attempt,
        kind=FaultKind.HANG,
        ranks=[r.rank for r in culprits],
        nodes=sorted({r.node for r in culprits}),
        phase=culprits[0].phase,
        step=step + 1,
        steps_lost=lost,
        seconds_lost=round(now - min(r.at for r in culprits) + computed, 1),
        line=line,
    )
    dump_stacks(local)
    if settings.supervised:  # the job's supervisor decides, with what the other nodes saw
        faults.write_finding(paths.progress, node, record)
    else:
        record.job, record.job_nodes = settings.job, settings.job_nodes
        limits = decisions.Limits(settings.max_restarts, settings.max_requeues)
        partition = scheduler.partition_nodes(settings.partition) if settings.job else None
        where = decisions.Allocation(needed=settings.job_nodes, partition=partition)
        decision = decisions.act(paths.failures_log, record, limits, where)
        _log.error(f"hang at step {record.step}: {decision.said}")
    end(local)


def end(local: list[Progress]) -> None:
    for r in local:
        if alive(r.pid):
            os.kill(r.pid, signal.SIGKILL)


def watch(settings: WatchdogSettings) -> None:
    # every rank rewrites its file as it starts: older reports are a previous attempt's
    since = time.time() - 60.0
    paths = RunPaths.of(settings.workdir)
    saves_s = recorded_save_s(paths)  # the earlier attempts'; this one's come in the reports
    while alive(settings.parent_pid):
        time.sleep(POLL_S)
        everyone = [r for r in read(paths.progress) if r.at >= since]
        local = [r for r in everyone if r.node == settings.node and alive(r.pid)]
        if local and stalled(local, settings.timeout_s, time.time(), saves_s):
            act(local, everyone, settings, saves_s)
            return


def main(argv: list[str]) -> None:
    # Slurm's requeue of this job ends its processes: this one finishes acting first
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch(WatchdogSettings.from_argv(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
