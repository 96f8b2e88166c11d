"""A training rank that stops making progress: the node's watchdog names it in one line, has
every rank write its Python stack to its log, records the fault and ends the attempt. Until it
is frozen the two ranks train evenly, and no straggler may be named (the counterpart of
tests/cli/test_stragglers.py, which holds one back)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from pipeline.core.paths import RunPaths
from pipeline.resilience import progress
from pipeline.resilience.watchdog import STARTUP_BOUND_S, first_stopped, limit_s
from tests.cli.test_stragglers import TRAIN, named_stragglers
from tests.conftest import copy_tokenized, launch, status

HANG_TIMEOUT_S = 10
EVEN_STEPS = 40  # trained evenly before the freeze: 8 log intervals, as many as a straggler needs


def _report(rank: int, step: int, phase: str, at: float, step_s: float = 0.0, save_s=0.0):
    return progress.Progress(at, step, phase, step_s, pid=0, node="n1", rank=rank, save_s=save_s)


def test_the_limit_follows_the_measured_step_with_a_bound_for_slow_phases():
    assert limit_s(_report(0, 5, "optimizer", 0, step_s=2.0), None) == 60  # at least a minute
    assert limit_s(_report(0, 5, "optimizer", 0, step_s=30.0), None) == 300  # ten steps
    assert limit_s(_report(0, 0, "data", 0), None) == STARTUP_BOUND_S  # none measured yet
    assert limit_s(_report(0, 5, "save", 0, step_s=2.0), 10) == STARTUP_BOUND_S
    assert limit_s(_report(0, 5, "forward-backward", 0, step_s=2.0), 10) == 10


def test_a_save_is_bounded_by_what_saves_took_once_one_is_measured():
    # frozen in a save: found within resilience.hang_timeout_s, unless saves take longer
    assert limit_s(_report(0, 5, "save", 0, step_s=2.0, save_s=0.5), 20) == 20
    assert limit_s(_report(0, 5, "save", 0, step_s=2.0, save_s=30.0), 20) == 300  # ten saves
    # one of an earlier attempt, from train/metrics.jsonl
    assert limit_s(_report(0, 5, "save", 0, step_s=2.0), 20, recorded_save_s=3.0) == 30
    assert limit_s(_report(0, 5, "save", 0, save_s=0.5), None) == 60  # derived: a minute at least
    assert limit_s(_report(0, 5, "validate", 0, save_s=0.5), 20) == STARTUP_BOUND_S


def test_the_rank_that_stopped_first_is_named_not_those_waiting_for_it():
    waiting = [_report(0, 7, "optimizer", 100.0), _report(2, 7, "optimizer", 100.5)]
    stopped = _report(1, 6, "forward-backward", 99.0)
    assert first_stopped([*waiting, stopped], "n1") == [stopped]


def test_a_rank_frozen_mid_training_is_named_with_every_stack_within_the_timeout(
    tokenized, tmp_path
):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    paths = RunPaths.of(workdir)
    proc = launch(
        f"workdir={workdir}",
        *TRAIN,
        "train.steps=100000",
        f"resilience.hang_timeout_s={HANG_TIMEOUT_S}",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        frozen = None
        while frozen is None and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
            reports = {r.rank: r for r in progress.read(paths.progress)}
            rank1 = reports.get(1)
            if rank1 and rank1.step >= EVEN_STEPS and rank1.phase not in progress.SLOW_PHASES:
                frozen = rank1
                os.kill(frozen.pid, signal.SIGSTOP)
                stopped_at = time.time()
        assert frozen is not None, f"training never reached step {EVEN_STEPS}"
        _, stderr = proc.communicate(timeout=HANG_TIMEOUT_S + 60)
        took = time.time() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert took < HANG_TIMEOUT_S + 30, f"detected {took:.0f} s after the rank froze"
    last = stderr.strip().splitlines()[-1]
    assert "hang: no progress for 10 s (resilience.hang_timeout_s=10): rank 1 on " in last, last
    assert "(process stopped)" in last and "1 other rank(s) waiting" in last, last
    assert "Traceback" not in stderr
    logs = sorted((workdir / "logs" / "jobs" / "train").glob("*/*_log.err"))
    assert len(logs) == 2
    for log in logs:  # every rank's stack, down to the training loop
        text = log.read_text()
        assert "most recent call first" in text and "in fit" in text, log
    (record,) = [json.loads(line) for line in paths.failures_log.read_text().splitlines()]
    assert record["kind"] == "hang" and record["ranks"] == [1]
    assert record["step"] > EVEN_STEPS and record["action"] == "ended the attempt"
    assert record["seconds_lost"] >= HANG_TIMEOUT_S
    said = status(workdir)
    assert "FAILED" in said.stdout and "rank 1 on" in said.stdout, said.stdout
    # the steps before the freeze, neither rank held back: no straggler named anywhere
    assert named_stragglers(workdir) == [] and "straggler: " not in stderr
    assert "stragglers" not in said.stdout
