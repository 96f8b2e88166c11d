"""What ended a training attempt, told from what the attempt left behind: a hang (the file a
node's watchdog wrote), a lost node (gone from the job, or down), a rank that ran out of
memory or raised (the file it wrote as it died), a rank killed or exiting otherwise (srun's
own lines). Each fault comes back as the record train/failures.jsonl keeps, less the action.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from pipeline.core import files
from pipeline.core.errors import StageError
from pipeline.core.paths import CHECKPOINT_TRACKER, RunPaths
from pipeline.runtime import progress

HANG = "hang"
CRASH = "crash"
OUT_OF_MEMORY = "out of memory"
NODE_LOST = "node lost"
STOPPED = "stopped"  # a rank stopped the run on purpose (StageError: diverged, a bad input...)
QUOTED_LINES = 5  # of a crashed rank's log

# srun: error: n2: task 1: Exited with exit code 1  /  srun: error: n2: tasks 0-1: Killed
_SRUN_TASKS = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)")
_OOM_TEXT = ("out of memory", "can't allocate memory", "oom-kill")


def out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's failure (a RuntimeError)."""
    name = type(error).__name__
    return name == "OutOfMemoryError" or any(t in str(error).lower() for t in _OOM_TEXT)


def checkpoint_step(checkpoints: Path) -> int:
    try:
        name = (checkpoints / CHECKPOINT_TRACKER).read_text().strip()
    except OSError:
        return 0
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0


def write_finding(folder: Path, node: str, record: dict) -> None:
    """A node's watchdog found a hang: its record, for the job's supervisor."""
    files.write_json(folder / f"hang-{node}.json", record)


def found_since(folder: Path, since: float) -> bool:
    return any(p.stat().st_mtime >= since for p in folder.glob("hang-*.json"))


def write_death(folder: Path, rank: int, step: int, error: BaseException) -> None:
    """This rank is ending on `error`: what and at which step, for the job's supervisor."""
    kind = (
        OUT_OF_MEMORY
        if out_of_memory(error)
        else STOPPED
        if isinstance(error, StageError)
        else CRASH
    )
    line = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
    record = {"kind": kind, "rank": rank, "node": progress.node_name(), "step": step}
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


def down(nodes: list[str]) -> set[str]:
    """Those of `nodes` Slurm holds down or failing."""
    try:
        shown = subprocess.run(
            ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %t"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    pairs = [line.split() for line in shown.stdout.splitlines() if len(line.split()) == 2]
    return {n for n, state in pairs if state.rstrip("*~#!%$@^-").startswith(("down", "fail"))}


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
) -> dict:
    """The fault that ended attempt `attempt` on `nodes`; `now_held`: the job's nodes since it
    ended; `log_of(rank)`: that rank's error log."""
    reports = {r.rank: r for r in progress.read(paths.progress)}
    hangs = sorted(paths.progress.glob("hang-*.json"), key=lambda p: p.stat().st_mtime)
    lost = sorted(n for n in nodes if n not in now_held) or sorted(down(nodes))
    deaths = sorted(
        (files.read_json(p) for p in paths.progress.glob("died-*.json")), key=lambda d: d["at"]
    )
    ended = [m.groups() for m in map(_SRUN_TASKS.search, srun_lines.splitlines()) if m]
    if ended and not any(d["kind"] in (OUT_OF_MEMORY, STOPPED) for d in deaths):
        # a rank killed by a signal leaves no record, and its peers' errors follow its end
        first = set(_tasks(ended[0][1]))
        deaths = deaths if any(d["rank"] in first for d in deaths) else []
    deaths.sort(key=lambda d: d["kind"] not in (OUT_OF_MEMORY, STOPPED))
    if hangs:
        return {**files.read_json(hangs[0]), "attempt": attempt}
    if lost:
        ranks = sorted(r.rank for r in reports.values() if r.node in lost)
        record = {"kind": NODE_LOST, "ranks": ranks, "nodes": lost}
        who, what = f"{', '.join(lost)} (ranks {ranks})", "left the job"
    elif deaths:
        first = deaths[0]
        record = {"kind": first["kind"], "ranks": [first["rank"]], "nodes": [first["node"]]}
        who, what = f"rank {first['rank']} on {first['node']}", first["error"]
    elif ended:
        node, listed, how = ended[0]
        record = {"kind": CRASH, "ranks": _tasks(listed), "nodes": [node]}
        who, what = f"rank(s) {listed} on {node}", how
    else:
        record = {"kind": CRASH, "ranks": [], "nodes": []}
        who, what = "a rank", "ended with an error and none said which"
    culprits = [reports[r] for r in record["ranks"] if r in reports]
    step = max(
        (r.step for r in culprits), default=max((r.step for r in reports.values()), default=0)
    )
    if record["kind"] != NODE_LOST and deaths:
        step = deaths[0]["step"]
    lost_steps = max(0, step - checkpoint_step(paths.checkpoints))
    step_s = max((r.step_s for r in reports.values()), default=0.0)
    quoted = [q for r in record["ranks"][:1] for q in last_lines(log_of(r))]
    since = max((r.at for r in culprits), default=time.time())
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "attempt": attempt,
        **record,
        "step": step + 1,
        "steps_lost": lost_steps,
        "seconds_lost": round(time.time() - since + lost_steps * step_s, 1),
        "line": f"{record['kind']}: {who} in step {step + 1}: {what}",
        **({"last_lines": quoted} if quoted and record["kind"] == CRASH else {}),
    }
