"""Checkpoints written in the background (train.async_save): training goes on while a save is
in flight; a kill -9 then leaves the checkpoint before it as the latest, and the rerun
continues the uninterrupted curve bit for bit; every save's and resume's times are logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint
from tests.conftest import ROOT, SMALL_SERIAL, cli, copy_tokenized, loss_curve

# wide enough that a save takes a while to write (about 160 MB with AdamW's moments)
ARGS = [
    *SMALL_SERIAL,
    "model.hidden_size=512",
    "model.ffn_hidden_size=1536",
    "train.steps=30",
    "train.save_interval=10",
    "train.log_interval=1",
    "stages=[train]",
]


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (the forked checkpoint writer and its workers)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # ended meanwhile
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _steps_logged(workdir: Path) -> int:
    path = workdir / "train" / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    steps = [json.loads(line)["step"] for line in lines[:-1]]  # the last may be half written
    return max(steps, default=0)


def kill_with_a_save_in_flight(workdir: Path, args: list[str], step: int) -> None:
    """Run the pipeline on `workdir`; hold the writer of the save of `step` still the moment
    it is forked (SIGSTOP: the save stays in flight for as long as this wants); check that
    training goes on meanwhile and nothing records the save as done; then kill -9 it all."""
    root = RunPaths.of(workdir).checkpoints
    in_flight = root / f"{checkpoint.folder_name(step)}.partial"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "cluster=local", f"workdir={workdir}", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its process group: the trainer and its writer
    )
    try:
        deadline = time.time() + 600
        while not in_flight.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.001)
        # processes already there (data-loading workers) are not the writer, forked after
        before = set(_descendants(proc.pid))
        writer: list[int] = []
        while not writer and time.time() < deadline and proc.poll() is None:
            writer = [p for p in _descendants(proc.pid) if p not in before]
            for pid in writer:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(0.001)
        assert writer, f"no writer of step {step}'s save was seen"
        time.sleep(0.5)
        for pid in set(_descendants(proc.pid)) - before:  # any the writer forked meanwhile
            os.kill(pid, signal.SIGSTOP)

        # training goes on while the save is in flight, and nothing records it as done
        while _steps_logged(workdir) < step + 4 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert _steps_logged(workdir) >= step + 4, "training waited for the save"
        assert not (in_flight / "COMPLETE.json").exists()
        finished = sorted(p.name for p in checkpoint.finished(root))
        assert finished and checkpoint.folder_name(step) not in finished
        assert (root / checkpoint.TRACKER).read_text() == finished[-1] + "\n"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_kill_while_a_save_is_in_flight_resumes_from_the_one_before(tokenized, tmp_path):
    reference = copy_tokenized(tokenized, tmp_path / "uninterrupted")
    result = cli(f"workdir={reference}", *ARGS)
    assert result.returncode == 0, result.stderr[-3000:]

    workdir = copy_tokenized(tokenized, tmp_path / "killed")
    root = RunPaths.of(workdir).checkpoints
    kill_with_a_save_in_flight(workdir, ARGS, 20)
    assert [p.name for p in checkpoint.finished(root)] == [checkpoint.folder_name(10)]

    rerun = cli(f"workdir={workdir}", *ARGS)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {root / checkpoint.folder_name(10)} at step 10" in rerun.stderr
    assert loss_curve(workdir) == loss_curve(reference)  # steps 11-30 again, bit for bit
    assert [p.name for p in checkpoint.finished(root)] == ["iter_0000020", "iter_0000030"]
    assert all(checkpoint.is_valid(p) for p in checkpoint.finished(root))
    assert not list(root.glob("*.partial"))

    records = [json.loads(line) for line in (workdir / "train" / "metrics.jsonl").open()]
    saves = [r for r in records if "checkpoint_blocked_s" in r]
    assert [r["step"] for r in saves] == [10, 20, 30]  # 10 from the first attempt
    assert all(0 < r["checkpoint_blocked_s"] <= r["checkpoint_total_s"] for r in saves)
    [resume] = [r for r in records if "resumed_from" in r]
    assert resume["resumed_from"] == "iter_0000010" and resume["resume_load_s"] > 0


def test_saved_in_the_background_or_not_a_checkpoint_holds_the_same_bytes(tokenized, tmp_path):
    """The same files in COMPLETE.json, the same tensor files byte for byte (hashed by their
    writer), and nothing of the save's own bookkeeping left in the folder."""
    completes = {}
    for async_save in ("true", "false"):
        workdir = copy_tokenized(tokenized, tmp_path / async_save)
        args = [*SMALL_SERIAL, "train.steps=10", "stages=[train]"]
        result = cli(f"workdir={workdir}", *args, f"train.async_save={async_save}")
        assert result.returncode == 0, result.stderr[-3000:]
        [folder] = checkpoint.finished(RunPaths.of(workdir).checkpoints)
        assert checkpoint.problem(folder) is None
        assert not (folder / checkpoint.DIGESTS).exists()
        completes[async_save] = json.loads((folder / "COMPLETE.json").read_text())
    background, blocking = completes["true"], completes["false"]
    assert sorted(background["sha256_blocks"]) == sorted(background["files"])
    assert background["files"].keys() == blocking["files"].keys()
    tensors = [name for name in background["files"] if name.endswith(".distcp")]
    digests = background["sha256_blocks"], blocking["sha256_blocks"]
    assert tensors and all(digests[0][n] == digests[1][n] for n in tensors)
    assert all(background["files"][n] == blocking["files"][n] for n in tensors)
