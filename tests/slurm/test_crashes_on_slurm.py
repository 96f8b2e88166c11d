"""Crashed ranks on a real 3-node Slurm cluster, a 2-node training job without a spare: a rank
killed twice on one node has that node set aside (the first crash restarts the ranks in place,
the second requeues the job without the node) and the run completes on the others with the
loss curve of a run that never crashed; a rank that always fails at the same step stops the
run after its second try, in one line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from pipeline.core.paths import RunPaths
from pipeline.resilience import progress
from tests.conftest import ROOT, SMALL_SERIAL, cli, copy_tokenized
from tests.slurm.test_multinode import BATCH, assert_same_curve, losses, wait_until
from tests.slurm.test_pipeline_on_slurm import pipeline, wait_for

TWO_NODES = ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1"]
STEPS = ["train.steps=40", "train.save_interval=10", "train.log_interval=1"]
INJECTION = ROOT / "tests" / "slurm" / "injection"


def _records(paths: RunPaths) -> list[dict]:
    return [json.loads(line) for line in paths.failures_log.read_text().splitlines()]


def _supervisor_log(workdir: Path) -> str:
    """The training job's own log (its ranks' are *_rankN_log.*)."""
    [job] = json.loads((workdir / "jobs.json").read_text())[-1]["jobs"]["train"]
    return (workdir / "logs" / "jobs" / "train" / job / f"{job}_0_log.err").read_text()


def _kill_rank_1_past(paths: RunPaths, step: int, saved: int, after: int) -> tuple[str, int]:
    """SIGKILL rank 1 once it is past `step` with checkpoint `saved` written, unless it is
    process `after` (killed before); returns its node and pid."""

    def ready() -> progress.Progress | None:
        reports = {r.rank: r for r in progress.read(paths.progress)}
        done = (paths.checkpoints / f"iter_{saved:07d}" / "COMPLETE.json").exists()
        rank = reports.get(1)
        return rank if done and rank and rank.step >= step and rank.pid != after else None

    assert wait_until(lambda: ready() is not None, 600)
    victim = ready()
    os.kill(victim.pid, signal.SIGKILL)  # every node is this machine
    return victim.node, victim.pid


def test_a_rank_crashing_twice_on_one_node_sets_it_aside_and_the_run_completes(
    slurm_cluster, tokenized, tmp_path
):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    paths = RunPaths.of(workdir)
    pipeline(f"workdir={workdir}", *SMALL_SERIAL, *BATCH, *TWO_NODES, *STEPS)
    node, pid = _kill_rank_1_past(paths, 13, saved=10, after=0)
    again, _ = _kill_rank_1_past(paths, 23, saved=20, after=pid)
    assert again == node  # the first crash restarted the ranks on the same nodes
    states = wait_for(workdir, 600)
    assert states["train"][0]["state"] == "COMPLETED", states

    first, second = _records(paths)
    assert (first["kind"], first["nodes"], first["ranks"]) == ("crash", [node], [1])
    assert first["action"] == "restarted in the allocation" and first["excluded"] == []
    assert second["kind"] == "crash" and second["step"] > first["step"]
    assert second["action"] == f"requeued without {node} (no spare node left)"
    attempts = json.loads(paths.ranks.read_text())["attempts"]
    assert [node in {r["node"] for r in a["ranks"]} for a in attempts] == [True, True, False]
    assert "Killed" in first["line"] and "last_lines" in first
    summary = json.loads(paths.summary.read_text())
    assert summary["restarts"] == 2

    uninterrupted = copy_tokenized(tokenized, tmp_path / "uninterrupted")
    result = cli(f"workdir={uninterrupted}", *SMALL_SERIAL, *BATCH, *STEPS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_curve(losses(workdir), losses(uninterrupted))


def test_a_rank_that_always_fails_at_the_same_step_stops_the_run_after_its_second_try(
    slurm_cluster, tokenized, tmp_path, monkeypatch
):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    paths = RunPaths.of(workdir)
    monkeypatch.setenv("PYTHONPATH", str(INJECTION))  # sbatch passes the environment on
    monkeypatch.setenv("PIPELINE_TEST_FAIL_AT", "1:15")
    pipeline(f"workdir={workdir}", *SMALL_SERIAL, *BATCH, *TWO_NODES, *STEPS)
    states = wait_for(workdir, 600)
    assert states["train"][0]["state"] == "FAILED", states

    first, second = _records(paths)
    assert first["kind"] == second["kind"] == "crash" and first["step"] == second["step"] == 15
    assert first["ranks"] == second["ranks"] == [1]
    assert "RuntimeError: injected fault in step 15" in first["line"]
    assert first["action"] == "restarted in the allocation"
    stop = "stopped: a crash at step 15 again after a restart, which made no progress"
    assert second["action"] == stop
    logs = _supervisor_log(workdir)
    assert logs.count(stop) == 1
    assert "Traceback" not in logs  # one line, not a trace
    quoted = [line for line in logs.splitlines() if line.startswith("    | ")]
    assert quoted[-1].endswith("RuntimeError: injected fault in step 15")  # its last lines
