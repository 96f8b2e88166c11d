"""What a training job does about a fault: requeue without the nodes at fault, stop when a
restart made no progress, the restarts are spent or too few nodes would be left; outside
Slurm, end the attempt."""

from __future__ import annotations

from pipeline.runtime.fault_actions import decide


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
        "stopped: 2 restarts reached cluster.max_restarts",
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
