"""A slow rank among two gloo ranks (cluster.executor=subprocess): one held back by SIGSTOP and
SIGCONT duty cycling is named as a straggler, with its node, within 50 steps, in the log, the
metrics, the report and `make status`. A run where neither is held back names none: that is the
run tests/cli/test_hangs.py freezes a rank of, checked before the freeze."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

from pipeline.core.paths import RunPaths
from pipeline.resilience import progress
from tests.conftest import SMALL_SERIAL, copy_tokenized, launch, status

TRAIN = [
    *SMALL_SERIAL,
    "stages=[train]",
    "train.steps=40",
    "train.log_interval=5",
    "train.eval_interval=40",
    "train.save_interval=0",
    "cluster.executor=subprocess",
    "cluster.tasks_per_node=2",
]


def _train_holding_back(workdir, hold_back_rank: int) -> subprocess.CompletedProcess:
    paths = RunPaths.of(workdir)
    proc = launch(
        f"workdir={workdir}", *TRAIN, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    done = threading.Event()

    def hold_back() -> None:  # stopped 40% of the time once it trains
        pid = None
        while not done.is_set() and pid is None:
            reports = {r.rank: r for r in progress.read(paths.progress)}
            if hold_back_rank in reports and reports[hold_back_rank].phase != "start":
                pid = reports[hold_back_rank].pid
            time.sleep(0.05)
        while pid and not done.is_set():
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.02)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            time.sleep(0.03)

    threading.Thread(target=hold_back, daemon=True).start()
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        done.set()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def named_stragglers(workdir) -> list[dict]:
    lines = (RunPaths.of(workdir).metrics).read_text().splitlines()
    return [s for r in map(json.loads, lines) for s in r.get("stragglers", [])]


def test_a_rank_held_back_is_named_within_50_steps(tokenized, tmp_path):
    slow = copy_tokenized(tokenized, tmp_path / "slow")
    result = _train_holding_back(slow, hold_back_rank=1)
    assert result.returncode == 0, result.stderr[-3000:]
    named = named_stragglers(slow)
    assert named and {s["rank"] for s in named} == {1}, named
    assert named[0]["ratio"] > 1.1 and named[0]["node"]
    assert "straggler: rank 1 on " in result.stderr
    assert "| Stragglers" not in (slow / "report.md").read_text()  # a heading, not a row
    assert "### Stragglers" in (slow / "report.md").read_text()
    said = status(slow)
    assert f"stragglers: rank 1 on {named[0]['node']}" in said.stdout, said.stdout
    records = [json.loads(line) for line in RunPaths.of(slow).metrics.read_text().splitlines()]
    split = [r for r in records if "work_s" in r]
    assert split and all(len(r["work_s"]) == len(r["wait_s"]) == 2 for r in split)
