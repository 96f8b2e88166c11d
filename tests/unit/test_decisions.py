"""What a training job does about a fault: requeue without the nodes at fault, stop when a
restart made no progress, the restarts are spent or too few nodes would be left; outside
Slurm, end the attempt. One decision function for both paths: a hand-written script's
watchdog (no allocation to restart in) and the job's supervisor. The records before a fault
are given as train/failures.jsonl held them before `decision` was written: the sentence alone."""

from __future__ import annotations

import json

from pipeline.resilience import decisions, records
from pipeline.resilience.decisions import Allocation, Limits
from pipeline.resilience.records import Action, FaultKind, FaultRecord

MANY = 100  # resilience.max_requeues, out of the way


def _record(data: dict) -> FaultRecord:
    return FaultRecord.from_json({"line": "", **data})


def decide(
    record: dict, before: list[dict], max_restarts: int, nodes: set[str] | None = None
) -> tuple[str, list[str]]:
    """A hand-written script's watchdog: `nodes`, those of the partition when known."""
    where = Allocation(needed=record.get("job_nodes", 0), partition=nodes)
    limits = Limits(max_restarts, MANY)
    decision = decisions.decide(_record(record), [_record(r) for r in before], limits, where)
    return decision.said, decision.aside


def decide_supervised(
    record: dict, before: list[dict], max_restarts: int, held: list[str], needed: int
) -> tuple[str, list[str]]:
    """The job's supervisor, holding `held` and needing `needed` of them an attempt."""
    where = Allocation(needed=needed, held=held)
    limits = Limits(max_restarts, MANY)
    job = {"job": "7"}
    before_records = [_record({**job, **r}) for r in before]
    decision = decisions.decide(_record({**job, **record}), before_records, limits, where)
    return decision.said, decision.aside


def _fault(step: int, nodes: list[str], attempt: int = 1, job: str | None = "7", **more) -> dict:
    record = {"job": job, "attempt": attempt, "kind": "hang", "step": step, "nodes": nodes}
    return {**record, "ranks": [1], "job_nodes": 2, **more}


FIRST = {**_fault(15, ["n2"], attempt=0), "action": "requeued without n2"}


def test_a_fault_requeues_without_every_node_at_fault_in_this_job_so_far():
    assert decide(_fault(15, ["n2"], attempt=0), [], 3) == ("requeued without n2", ["n2"])
    assert decide(_fault(31, ["n3"]), [FIRST], 3) == ("requeued without n2,n3", ["n2", "n3"])


def test_the_same_fault_at_the_same_step_after_a_restart_stops_the_run():
    action, excluded = decide(_fault(15, ["n3"]), [FIRST], 3)
    assert action.startswith("stopped: a hang at step 15 again after a restart") and not excluded
    assert decide(_fault(15, ["n3"], kind="crash"), [FIRST], 3)[0].startswith("requeued")


def test_restarts_stop_at_cluster_max_restarts_and_nothing_requeues_outside_slurm():
    before = [
        {**_fault(s, ["n2"], attempt=a), "action": "requeued without n2"}
        for a, s in [(0, 5), (1, 9)]
    ]
    assert decide(_fault(20, ["n1"], attempt=2), before, 2) == (
        "stopped: 2 restarts reached resilience.max_restarts",
        [],
    )
    assert decide(_fault(20, ["n1"], job=None), [], 3) == ("ended the attempt", [])


def test_nodes_are_left_out_only_while_the_partition_keeps_enough_for_the_job():
    partition = {"n1", "n2", "n3", "n4"}
    assert decide(_fault(31, ["n3"]), [FIRST], 3, partition)[1] == ["n2", "n3"]
    three = {"n1", "n2", "n3"}  # without n2 and n3 one is left: only this fault's node is
    assert decide(_fault(31, ["n3"]), [FIRST], 3, three) == ("requeued without n3", ["n3"])
    action, excluded = decide(_fault(31, ["n1", "n3"]), [FIRST], 3, three)
    assert (
        action.startswith("stopped: without n1,n3 the partition has fewer than the 2")
        and not excluded
    )


def _supervised(kind: str, step: int, nodes: list[str], attempt: int, **more) -> dict:
    record = {"attempt": attempt, "kind": kind, "step": step, "nodes": nodes, "ranks": [1]}
    return {"allocation": 0, "line": f"{kind}: rank 1 on {nodes}", **record, **more}


def _then(record: dict, action: str, excluded: list[str]) -> dict:
    return {**record, "action": action, "excluded": excluded}


HELD = ["n1", "n2", "n3"]  # two nodes train, one is spare


def test_a_hang_sets_its_node_aside_and_the_spare_takes_its_place():
    hang = _supervised("hang", 15, ["n2"], 1)
    assert decide_supervised(hang, [], 3, HELD, 2) == (
        "restarted in the allocation without n2",
        ["n2"],
    )
    lost = _supervised("node lost", 31, ["n3"], 2)
    before = [_then(hang, "restarted in the allocation without n2", ["n2"])]
    assert decide_supervised(lost, before, 3, ["n1", "n3"], 2) == (
        "requeued without n3 (no spare node left)",
        ["n3"],
    )


def test_a_crash_restarts_in_place_and_a_second_crash_on_its_node_sets_it_aside():
    first = _supervised("crash", 15, ["n2"], 1)
    assert decide_supervised(first, [], 3, ["n1", "n2"], 2) == ("restarted in the allocation", [])
    second = _supervised("crash", 27, ["n2"], 2)
    before = [_then(first, "restarted in the allocation", [])]
    assert decide_supervised(second, before, 3, ["n1", "n2"], 2) == (
        "requeued without n2 (no spare node left)",
        ["n2"],
    )
    elsewhere = _supervised("crash", 27, ["n1"], 2)  # one crash on each node: neither is set aside
    assert decide_supervised(elsewhere, before, 3, ["n1", "n2"], 2)[1] == []


def test_the_same_crash_at_the_same_step_stops_and_out_of_memory_is_never_retried():
    first = _supervised("crash", 15, ["n2"], 1)
    before = [_then(first, "restarted in the allocation", [])]
    action, aside = decide_supervised(_supervised("crash", 15, ["n2"], 2), before, 3, HELD, 2)
    assert action.startswith("stopped: a crash at step 15 again after a restart") and not aside
    oom = _supervised("out of memory", 3, ["n1"], 1, line="out of memory in step 3 ...")
    assert decide_supervised(oom, [], 3, HELD, 2) == (
        "stopped, not retried: out of memory in step 3 ...",
        [],
    )
    diverged = _supervised("stopped", 3, ["n1"], 1, line="stopped: ... NonFinite: ...")
    assert decide_supervised(diverged, [], 3, HELD, 2)[0].startswith("stopped, not retried")


def test_restarts_in_one_allocation_stop_at_cluster_max_restarts_then_the_job_requeues():
    before = [
        _then(_supervised("hang", s, ["n9"], a), "restarted in the allocation", [])
        for a, s in [(1, 5), (2, 9)]
    ]
    assert decide_supervised(_supervised("hang", 20, ["n1"], 3), before, 2, HELD, 2) == (
        "requeued without n1 (resilience.max_restarts reached)",
        ["n1"],
    )
    requeued = _supervised("hang", 20, ["n1"], 3, allocation=1)  # a new allocation: anew
    assert decide_supervised(requeued, before, 2, HELD, 2)[0].startswith("restarted")


# train/failures.jsonl lines as 0.6 wrote them: a supervisor's, a hand-written script's watchdog's
OLD_LINES = [
    '{"time": "2026-11-30T10:00:00", "attempt": 1, "kind": "crash", "ranks": [1], "nodes": '
    '["n2"], "step": 15, "steps_lost": 5, "seconds_lost": 12.5, "line": "crash: rank 1 on n2 in '
    'step 15: E", "last_lines": ["E"], "job": "7", "job_nodes": 2, "allocation": 0, "action": '
    '"restarted in the allocation", "excluded": []}',
    '{"time": "2026-11-30T10:00:00", "attempt": 0, "kind": "hang", "ranks": [1], "nodes": ["n2"],'
    ' "phase": "optimizer", "step": 15, "steps_lost": 5, "seconds_lost": 30.0, "line": "hang: ..."'
    ', "job": "8", "job_nodes": 2, "action": "requeued without n2"}',
]


def test_records_written_before_decision_existed_are_read_and_written_back_alike(tmp_path):
    failures = tmp_path / "failures.jsonl"
    failures.write_text("".join(line + "\n" for line in OLD_LINES))
    (restarted,) = records.read(failures, "7")
    (requeued,) = records.read(failures, "8")
    assert (restarted.kind, restarted.decision) == (FaultKind.CRASH, Action.RESTARTED)
    assert (requeued.kind, requeued.decision) == (FaultKind.HANG, Action.REQUEUED)
    for line, record in zip(OLD_LINES, (restarted, requeued), strict=True):
        assert record.to_json() == {**json.loads(line), "decision": record.decision.value}
