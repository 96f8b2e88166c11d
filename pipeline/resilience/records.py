"""What train/failures.jsonl holds: one FaultRecord a line, each a fault that ended a training
attempt (what, where, at which step, what it cost) and what the job did about it.

The JSON is the one earlier versions wrote, with `decision` added: `action` stays the sentence
people read ("restarted in the allocation without n2"), `decision` the Action it stands for. A
record written before `decision` existed gets it from its sentence's first word, the one place
a sentence is read back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any


class FaultKind(str, Enum):
    HANG = "hang"
    CRASH = "crash"
    OUT_OF_MEMORY = "out of memory"
    NODE_LOST = "node lost"
    STOPPED = "stopped"  # a rank stopped the run on purpose (StageError: diverged, a bad input)


class Action(str, Enum):
    RESTARTED = "restarted"  # the ranks again, inside the allocation
    REQUEUED = "requeued"  # the job back in the queue
    STOPPED = "stopped"  # the run ends as failed
    ENDED = "ended"  # the attempt ends (no Slurm: nothing to restart)


# the optional keys, written only when set, as before
_OPTIONAL = ("phase", "last_lines", "allocation", "excluded", "job_nodes")


@dataclass
class FaultRecord:
    kind: FaultKind
    attempt: int
    step: int  # the step that did not finish, counted from 1
    ranks: list[int]
    nodes: list[str]
    line: str  # the one line that says what happened
    time: str = ""
    steps_lost: int = 0
    seconds_lost: float = 0.0
    phase: str | None = None  # a hang's
    last_lines: list[str] | None = None  # of a crashed rank's log
    # what the job did, once decided
    job: str | None = None
    job_nodes: int | None = None
    allocation: int | None = None  # SLURM_RESTART_COUNT of a supervised job
    decision: Action | None = None
    action: str = ""  # the decision in a sentence
    excluded: list[str] | None = None  # the nodes set aside by it

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        data["decision"] = self.decision.value if self.decision else None
        return {k: v for k, v in data.items() if not (k in _OPTIONAL and v is None)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FaultRecord:
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known})
        record.kind = FaultKind(record.kind)
        if record.decision:
            record.decision = Action(record.decision)
        elif record.action:  # written before `decision` was
            record.decision = Action(record.action.split()[0].rstrip(","))
        return record


@dataclass
class Decision:
    """What to do about a fault: the action, the nodes it sets aside, the sentence."""

    action: Action
    said: str
    aside: list[str] = field(default_factory=list)


def read(failures: Path, job: str | None) -> list[FaultRecord]:
    """Job `job`'s records so far (those with no job, outside Slurm, when None)."""
    try:
        lines = failures.read_text().splitlines()
    except OSError:
        return []
    records = [FaultRecord.from_json(json.loads(line)) for line in lines if line.strip()]
    return [r for r in records if r.job == job]


def append(failures: Path, record: FaultRecord) -> None:
    """One short line: a single write, whole, which other nodes' appends cannot split."""
    with open(failures, "a") as f:
        f.write(json.dumps(record.to_json()) + "\n")
