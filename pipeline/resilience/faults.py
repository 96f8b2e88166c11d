"""What ended a training attempt, told from what the attempt left behind: a hang (the file a
node's watchdog wrote), a lost node (gone from the job, or down), a rank that ran out of
memory or raised (the file it wrote as it died), a rank killed or exiting otherwise (srun's
own lines). Each fault comes back as the record train/failures.jsonl keeps, less the action.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from pipeline.core import files
from pipeline.core.errors import StageError
from pipeline.core.paths import RunPaths
from pipeline.resilience import progress, scheduler
from pipeline.resilience.records import FaultKind, FaultRecord
from pipeline.runtime import placement

NOT_RETRIED = (FaultKind.OUT_OF_MEMORY, FaultKind.STOPPED)  # a rank's own end, not a peer's

QUOTED_LINES = 5  # of a crashed rank's log

# srun: error: n2: task 1: Exited with exit code 1  /  srun: error: n2: tasks 0-1: Killed
_SRUN_TASKS = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)")
_OOM_TEXT = ("out of memory", "can't allocate memory", "oom-kill")


def out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's failure (a RuntimeError)."""
    name = type(error).__name__
    return name == "OutOfMemoryError" or any(t in str(error).lower() for t in _OOM_TEXT)


def checkpoint_step(paths: RunPaths) -> int:
    """The step of the newest complete checkpoint; 0: none yet."""
    name = paths.latest_checkpoint() or ""
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0


def write_finding(folder: Path, node: str, record: FaultRecord) -> None:
    """A node's watchdog found a hang: its record, for the job's supervisor."""
    files.write_json(folder / f"hang-{node}.json", record.to_json())


def found_since(folder: Path, since: float) -> bool:
    return any(p.stat().st_mtime >= since for p in folder.glob("hang-*.json"))


def write_death(folder: Path, rank: int, step: int, error: BaseException) -> None:
    """This rank is ending on `error`: what and at which step, for the job's supervisor."""
    kind = (
        FaultKind.OUT_OF_MEMORY
        if out_of_memory(error)
        else FaultKind.STOPPED
        if isinstance(error, StageError)
        else FaultKind.CRASH
    )
    line = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
    record = {"kind": kind.value, "rank": rank, "node": placement.node_name(), "step": step}
    record["at"] = time.time()  # the first to die is the fault; the others, its peers
    files.write_json(folder / f"died-{rank}.json", {**record, "error": line.strip()})


def clear(folder: Path) -> None:
    """Before an attempt: what the last one left is not this one's."""
    for stale in [*folder.glob("hang-*.json"), *folder.glob("died-*.json")]:
        stale.unlink(missing_ok=True)


def next_attempt(counter: Path) -> int:
    """The job's attempts, counted in its log folder across restarts and requeues."""
    try:
        attempt = int(counter.read_text()) + 1
    except (OSError, ValueError):
        attempt = 1
    files.write_text(counter, str(attempt))
    return attempt


def last_lines(log: Path, count: int = QUOTED_LINES) -> list[str]:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-count:]


def _tasks(listed: str) -> list[int]:
    ranks: list[int] = []
    for part in listed.split(","):
        first, _, last = part.partition("-")
        ranks.extend(range(int(first), int(last or first) + 1))
    return ranks


def diagnose(
    paths: RunPaths, srun_lines: str, nodes: list[str], now_held: list[str], log_of, attempt: int
) -> FaultRecord:
    """The fault that ended attempt `attempt` on `nodes`; `now_held`: the job's nodes since it
    ended; `log_of(rank)`: that rank's error log."""
    reports = {r.rank: r for r in progress.read(paths.progress)}
    hangs = sorted(paths.progress.glob("hang-*.json"), key=lambda p: p.stat().st_mtime)
    lost = sorted(n for n in nodes if n not in now_held) or sorted(scheduler.down(nodes))
    deaths = sorted(
        (files.read_json(p) for p in paths.progress.glob("died-*.json")), key=lambda d: d["at"]
    )
    for death in deaths:
        death["kind"] = FaultKind(death["kind"])
    ended = [m.groups() for m in map(_SRUN_TASKS.search, srun_lines.splitlines()) if m]
    if ended and not any(d["kind"] in NOT_RETRIED for d in deaths):
        # a rank killed by a signal leaves no record, and its peers' errors follow its end
        first = set(_tasks(ended[0][1]))
        deaths = deaths if any(d["rank"] in first for d in deaths) else []
    deaths.sort(key=lambda d: d["kind"] not in NOT_RETRIED)
    if hangs:
        found = FaultRecord.from_json(files.read_json(hangs[0]))
        found.attempt = attempt
        return found
    if lost:
        ranks = sorted(r.rank for r in reports.values() if r.node in lost)
        kind, culprit_ranks, culprit_nodes = FaultKind.NODE_LOST, ranks, lost
        who, what = f"{', '.join(lost)} (ranks {ranks})", "left the job"
    elif deaths:
        first = deaths[0]
        kind, culprit_ranks, culprit_nodes = first["kind"], [first["rank"]], [first["node"]]
        who, what = f"rank {first['rank']} on {first['node']}", first["error"]
    elif ended:
        node, listed, how = ended[0]
        kind, culprit_ranks, culprit_nodes = FaultKind.CRASH, _tasks(listed), [node]
        who, what = f"rank(s) {listed} on {node}", how
    else:
        kind, culprit_ranks, culprit_nodes = FaultKind.CRASH, [], []
        who, what = "a rank", "ended with an error and none said which"
    culprits = [reports[r] for r in culprit_ranks if r in reports]
    step = max(
        (r.step for r in culprits), default=max((r.step for r in reports.values()), default=0)
    )
    if kind is not FaultKind.NODE_LOST and deaths:
        step = deaths[0]["step"]
    lost_steps = max(0, step - checkpoint_step(paths))
    step_s = max((r.step_s for r in reports.values()), default=0.0)
    quoted = [q for r in culprit_ranks[:1] for q in last_lines(log_of(r))]
    since = max((r.at for r in culprits), default=time.time())
    return FaultRecord(
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
        attempt=attempt,
        kind=kind,
        ranks=culprit_ranks,
        nodes=culprit_nodes,
        step=step + 1,
        steps_lost=lost_steps,
        seconds_lost=round(time.time() - since + lost_steps * step_s, 1),
        line=f"{kind.value}: {who} in step {step + 1}: {what}",
        last_lines=quoted if quoted and kind is FaultKind.CRASH else None,
    )
