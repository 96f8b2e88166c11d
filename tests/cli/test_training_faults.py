"""Training faults through the command line: a save killed midway is never loaded and the rerun
matches an uninterrupted run; two gloo ranks stop together at a non-finite step."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint, retention
from tests.conftest import SMALL_SERIAL, cli, copy_tokenized, launch, loss_curve


def _train_command(workdir, save_interval: int = 1) -> list[str]:
    return [
        f"workdir={workdir}",
        *SMALL_SERIAL,
        "stages=[train]",
        "train.steps=30",
        f"train.save_interval={save_interval}",  # 1: saving most of the time, a kill lands mid-save
        "train.log_interval=1",
    ]


def test_a_save_killed_midway_is_never_loaded_and_the_rerun_matches(tokenized, tmp_path):
    killed = copy_tokenized(tokenized, tmp_path / "killed")
    root = RunPaths.of(killed).checkpoints
    proc = launch(*_train_command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if any(root.glob("iter_*.partial")) and any(root.glob("iter_???????")):
            break  # a save in progress, after at least one whole one
        time.sleep(0.002)
    assert proc.poll() is None, "training ended before a save could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    finished = [p for p in root.glob("iter_*") if retention.NAME.fullmatch(p.name)]
    assert all(checkpoint.is_valid(p) for p in finished)  # only whole saves have the name
    tracked = root / (root / checkpoint.TRACKER).read_text().strip()
    assert checkpoint.is_valid(tracked)
    newest = checkpoint.latest(root)
    assert newest is not None and newest.name >= tracked.name

    rerun = cli(*_train_command(killed))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {newest} at step" in rerun.stderr
    assert not list(root.glob("iter_*.partial"))
    clean = copy_tokenized(tokenized, tmp_path / "clean")  # saving only at its end
    assert cli(*_train_command(clean, save_interval=30)).returncode == 0
    assert loss_curve(killed) == loss_curve(clean)


def test_two_ranks_agree_and_stop_at_the_same_step_in_one_line(tokenized, tmp_path):
    """Two gloo ranks in their own processes: both stop at the same step (one alone would
    leave the other waiting in a collective), and the launcher says so in one line."""
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    result = cli(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        "stages=[train]",
        "train.lr=1e38",
        "train.nonfinite=stop",
        "cluster.executor=subprocess",
        "cluster.tasks_per_node=2",
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(r"error: train failed: \S*NonFinite: step \d+: loss \S+, grad norm nan", last)
    logs = sorted((workdir / "logs" / "jobs" / "train").glob("*/*_log.err"))
    stops = [re.findall(r"NonFinite: (step \d+)", log.read_text())[-1:] for log in logs]
    assert len(stops) == 2 and stops[0] == stops[1] and stops[0][0] in last, stops


def _address_space(limit: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_out_of_memory_is_one_line_naming_the_keys_that_need_less(tokenized, tmp_path):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    # a micro-batch whose activations need ~13 GiB, in a process allowed 6 GiB of address space
    big = ["train.micro_batch_size=16384", "train.global_batch_size=16384"]
    result = cli(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        *big,
        "stages=[train]",
        "train.steps=4",
        "train.warmup_steps=1",
        preexec_fn=_address_space(6 << 30),
    )
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if "out of memory" in line]
    assert "train.micro_batch_size (now 16384)" in line and "train.recompute=" in line
    assert line.endswith("not retried") and "Traceback" not in result.stderr
