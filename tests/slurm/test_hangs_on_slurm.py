"""A hung rank on a real 3-node Slurm cluster: a rank of a 2-node training job with a spare
node, frozen with SIGSTOP mid-training, is found by its node's watchdog within
resilience.hang_timeout_s + 30 s, every rank's stack is in the job's log, and the ranks restart
in the same allocation with the spare in the frozen node's place; the run resumes from its
newest checkpoint and ends with the loss curve of a run that never hung."""

from __future__ import annotations

import json
import os
import signal
import time

from pipeline.core.paths import RunPaths
from pipeline.resilience import faults, progress
from tests.conftest import SMALL_SERIAL, cli, copy_tokenized
from tests.slurm.test_multinode import BATCH, assert_same_curve, losses, wait_until
from tests.slurm.test_pipeline_on_slurm import pipeline, wait_for

HANG_TIMEOUT_S = 10
TWO_NODES = ["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1"]
SPARE = ["resilience.spare_nodes=1"]
SAVE_INTERVAL = 10
STEPS = ["train.steps=60", f"train.save_interval={SAVE_INTERVAL}", "train.log_interval=1"]


def test_a_frozen_rank_is_named_and_the_ranks_restart_on_the_spare_node(
    slurm_cluster, tokenized, tmp_path
):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    paths = RunPaths.of(workdir)
    pipeline(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        *BATCH,
        *TWO_NODES,
        *SPARE,
        *STEPS,
        "cluster.cpus_per_task=1",
        f"resilience.hang_timeout_s={HANG_TIMEOUT_S}",
    )

    def rank_1_past_a_checkpoint() -> progress.Progress | None:
        reports = {r.rank: r for r in progress.read(paths.progress)}
        saved = (paths.checkpoints / "iter_0000010" / "COMPLETE.json").exists()
        rank = reports.get(1)
        # in a step, not in validation or a save: those may take the start-up bound (900 s)
        busy = rank and rank.step >= 15 and rank.phase not in progress.SLOW_PHASES
        return rank if saved and busy else None

    assert wait_until(lambda: rank_1_past_a_checkpoint() is not None, 600)
    frozen = rank_1_past_a_checkpoint()
    os.kill(frozen.pid, signal.SIGSTOP)  # every node is this machine
    stopped_at = time.time()
    at_step = {r.rank: r for r in progress.read(paths.progress)}[1].step  # stopped: it holds
    assert wait_until(paths.failures_log.exists, HANG_TIMEOUT_S + 30)
    assert time.time() - stopped_at < HANG_TIMEOUT_S + 30
    saved = faults.checkpoint_step(paths)  # the newest now: the restarted ranks have not saved
    states = wait_for(workdir, 600)
    assert states["train"][0]["state"] == "COMPLETED", states

    (record,) = [json.loads(line) for line in paths.failures_log.read_text().splitlines()]
    assert record["kind"] == "hang" and record["ranks"] == [1]
    # the steps done since the newest checkpoint when the hang was found, to be done again: a
    # save then in flight (its writer is a process apart, not stopped) may complete just after
    since = at_step - record["steps_lost"]
    assert record["nodes"] == [frozen.node] and since in (saved, saved - SAVE_INTERVAL)
    assert record["action"] == f"restarted in the allocation without {frozen.node}"
    assert record["excluded"] == [frozen.node] and record["allocation"] == 0
    assert "(process stopped)" in record["line"]
    [job] = json.loads((workdir / "jobs.json").read_text())[-1]["jobs"]["train"]
    logs = "".join(
        p.read_text() for p in (workdir / "logs" / "jobs" / "train" / job).glob("*_log.*")
    )
    assert f"hang: no progress for {HANG_TIMEOUT_S} s" in logs
    assert logs.count("most recent call first") >= 2  # both ranks' stacks
    first, second = json.loads(paths.ranks.read_text())["attempts"]
    assert frozen.node in {r["node"] for r in first["ranks"]}
    assert frozen.node not in {r["node"] for r in second["ranks"]}
    assert len({r["node"] for r in first["ranks"] + second["ranks"]}) == 3  # the spare's turn
    assert "requeued" not in logs  # the same allocation throughout
    assert second["from_step"] >= 10

    summary = json.loads(paths.summary.read_text())
    assert summary["restarts"] == 1 and summary["lost_seconds"] == record["seconds_lost"]
    assert f"| hang | 1 | {frozen.node} |" in (workdir / "report.md").read_text()
    status = pipeline(f"workdir={workdir}", module="pipeline.status", check=False)
    assert "1 fault(s)" in status.stdout and f"hang of rank 1 on {frozen.node}" in status.stdout

    uninterrupted = copy_tokenized(tokenized, tmp_path / "uninterrupted")
    result = cli(f"workdir={uninterrupted}", *SMALL_SERIAL, *BATCH, *STEPS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_curve(losses(workdir), losses(uninterrupted))
