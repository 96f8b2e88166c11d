"""Checkpoints under faults: a byte altered on disk or a save killed midway is detected and
skipped, the previous whole checkpoint is loaded and the loss curve goes on as if nothing
happened; retention never deletes anything outside the run folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline import checkpoint, train
from pipeline.layout import RunLayout
from tests.conftest import CONF, SMALL_SERIAL, cli, copy_tokenized, loss_curve


@pytest.mark.parametrize("name", ["dist/__0_0.distcp", "optimizer_tp00_pp00.pt", "state.json"])
def test_a_flipped_byte_is_detected_and_the_previous_checkpoint_resumes(run_copy, name):
    cfg = run_copy
    cfg.train.log_interval = 1
    train.run(cfg)
    uninterrupted = loss_curve(cfg.workdir)
    layout = RunLayout.of(cfg.workdir)
    damaged = layout.checkpoints / checkpoint.folder_name(20)
    data = bytearray((damaged / name).read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the checksum can tell
    (damaged / name).write_bytes(bytes(data))
    assert checkpoint.problem(damaged) == f"{name} does not match its sha256 when saved"

    layout.train_done.unlink()
    with pytest.warns(UserWarning, match=f"iter_0000020: incomplete or damaged \\({name}"):
        resumed = train.run(cfg)
    assert resumed["status"] == "complete"
    assert loss_curve(cfg.workdir) == uninterrupted  # steps 11-20 again, bit for bit
    assert checkpoint.is_valid(damaged)  # saved again, whole


def _train_command(workdir) -> list[str]:
    return [
        f"workdir={workdir}",
        *SMALL_SERIAL,
        "stages=[train]",
        "train.steps=60",
        "train.save_interval=1",  # saving most of the time: a kill lands mid-save
        "train.log_interval=1",
    ]


def test_a_save_killed_midway_is_never_loaded_and_the_rerun_matches(tokenized, tmp_path):
    killed = copy_tokenized(tokenized, tmp_path / "killed")
    root = RunLayout.of(str(killed)).checkpoints
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "cluster=local", *_train_command(killed)],
        cwd=CONF.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if any(root.glob("iter_*.partial")) and any(root.glob("iter_???????")):
            break  # a save in progress, after at least one whole one
        time.sleep(0.002)
    assert proc.poll() is None, "training ended before a save could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    finished = [p for p in root.glob("iter_*") if checkpoint.NAME.fullmatch(p.name)]
    assert all(checkpoint.is_valid(p) for p in finished)  # only whole saves have the name
    tracked = root / (root / checkpoint.TRACKER).read_text().strip()
    assert checkpoint.is_valid(tracked)
    newest = checkpoint.latest(root)
    assert newest is not None and newest.name >= tracked.name

    rerun = cli(*_train_command(killed))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {newest} at step" in rerun.stderr
    assert not list(root.glob("iter_*.partial"))
    clean = copy_tokenized(tokenized, tmp_path / "clean")
    assert cli(*_train_command(clean)).returncode == 0
    assert loss_curve(killed) == loss_curve(clean)


def test_retention_never_deletes_outside_the_run_folder(run_copy, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    victim = elsewhere / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    root = RunLayout.of(run_copy.workdir).checkpoints
    root.mkdir()
    (root / "iter_0000001").symlink_to(victim)  # an old checkpoint name, leading outside
    (root / "iter_0000002.partial").symlink_to(victim)
    (root / "iter_0000003.partial").mkdir()  # left by a killed save: ours to clear
    run_copy.train.keep_last = 1
    with pytest.warns(UserWarning, match="not deleting .*iter_0000001: it leads outside"):
        train.run(run_copy)
    assert (victim / "precious").read_text() == "keep me"
    assert (root / "iter_0000001").is_symlink() and (root / "iter_0000002.partial").is_symlink()
    assert not (root / "iter_0000003.partial").exists()
    assert (root / checkpoint.folder_name(20)).is_dir()


def test_a_checkpoints_folder_linked_elsewhere_is_never_pruned(run_copy, tmp_path_factory):
    """The run's checkpoints go where the link leads, but retention deletes nothing there:
    the folder may be shared, and another run's checkpoints look just like ours."""
    elsewhere = tmp_path_factory.mktemp("scratch")
    theirs = elsewhere / "iter_0000005"
    theirs.mkdir()
    (theirs / "model.pt").write_text("another run's weights")
    RunLayout.of(run_copy.workdir).checkpoints.symlink_to(elsewhere)
    run_copy.train.keep_last = 1
    run_copy.train.steps = 30
    with pytest.warns(UserWarning, match="leads outside"):
        train.run(run_copy)
    assert (theirs / "model.pt").read_text() == "another run's weights"
    assert sorted(p.name for p in elsewhere.glob("iter_*")) == [
        "iter_0000005",
        "iter_0000010",
        "iter_0000020",
        "iter_0000030",
    ]
