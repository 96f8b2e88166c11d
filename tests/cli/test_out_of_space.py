"""No space left, for real: a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored so writes fail
with EFBIG as on a full disk) on the pipeline's own process. The run stops with one line
naming what it was writing, earlier complete outputs are untouched, and the same command
finishes once the limit is lifted."""

from __future__ import annotations

import re
import resource
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.training import checkpoint
from tests.conftest import SMALL_SERIAL, cli, copy_tokenized, launch

FULL_AT = 1_000_000  # no file may grow past 1 MB: optimizer.pt needs more


def ignore_sigxfsz() -> None:
    """In the child: a write past the limit fails with EFBIG instead of killing the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def limit_file_size(limit: int):
    def preexec() -> None:
        ignore_sigxfsz()
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return preexec


def error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr.strip().splitlines()[-1]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): files.sha256(p) for p in folder.rglob("*") if p.is_file()}


def fill_the_disk_after_the_first_checkpoint(
    workdir: Path, command: list[str], stderr: IO
) -> tuple[subprocess.Popen, float]:
    """Start the training; once its first checkpoint is complete, the disk fills up (the
    file-size limit lowered on the running process). Returns it and the test's deadline."""
    root = RunPaths.of(workdir).checkpoints
    proc = launch(*command, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=ignore_sigxfsz)
    deadline = time.time() + 300
    while proc.poll() is None and not (root / checkpoint.TRACKER).exists():
        assert time.time() < deadline
        time.sleep(0.005)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (FULL_AT, resource.RLIM_INFINITY))
    return proc, deadline


def test_disk_full_during_a_checkpoint_save_keeps_the_earlier_ones(tokenized, tmp_path):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    data_before = snapshot(workdir / "data")
    # three saves in a row fail (resilience.max_failed_saves=3): 20, 30 and 40
    command = [f"workdir={workdir}", *SMALL_SERIAL, "stages=[train]", "train.steps=50"]
    root = RunPaths.of(workdir).checkpoints
    with open(tmp_path / "stderr", "w+") as stderr:
        proc, _ = fill_the_disk_after_the_first_checkpoint(workdir, command, stderr)
        assert proc.wait(timeout=300) == 1
        stderr.seek(0)
        line = error_line(stderr.read())
    assert line.startswith("error: no space left writing checkpoint "), line
    assert "File too large (EFBIG); free space" in line
    kept = root / (root / checkpoint.TRACKER).read_text().strip()
    assert checkpoint.is_valid(kept)
    assert not list(root.glob("iter_*.partial")), "the failed save's files are removed"
    assert all(checkpoint.is_valid(p) for p in root.glob("iter_*"))
    assert snapshot(workdir / "data") == data_before

    rerun = cli(*command)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {kept} at step" in rerun.stderr
    assert files.read_json(workdir / "train" / "DONE.json")["train_steps"] == 50


def test_a_save_onto_a_full_disk_is_skipped_and_the_next_succeeds_once_there_is_space(
    tokenized, tmp_path
):
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    # lifted before resilience.max_failed_saves=5 saves in a row fail (40 to 120), then 140 to 160
    steps = ["train.steps=160", "train.save_interval=20", "resilience.max_failed_saves=5"]
    command = [f"workdir={workdir}", *SMALL_SERIAL, "stages=[train]", *steps]
    root = RunPaths.of(workdir).checkpoints
    with open(tmp_path / "stderr", "w+") as stderr:
        proc, deadline = fill_the_disk_after_the_first_checkpoint(workdir, command, stderr)
        while proc.poll() is None and "is skipped" not in Path(stderr.name).read_text():
            assert time.time() < deadline
            time.sleep(0.005)
        # space again
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        assert proc.wait(timeout=300) == 0
        stderr.seek(0)
        log = stderr.read()
    warnings = [line for line in log.splitlines() if "is skipped" in line]
    assert 1 <= len(warnings) < 5 and "Traceback" not in log
    assert warnings[0].startswith("warning: no space left writing checkpoint "), warnings[0]
    assert "training goes on and the next save tries again (1 in a row" in warnings[0]
    assert "rerun" not in warnings[0]  # the run goes on: nothing to rerun
    skipped = [int(re.search(r"the save of step (\d+)", w).group(1)) for w in warnings]
    assert not any((root / checkpoint.folder_name(s)).exists() for s in skipped)
    assert not list(root.glob("iter_*.partial"))
    assert (root / checkpoint.TRACKER).read_text().strip() == checkpoint.folder_name(160)
    assert checkpoint.is_valid(root / checkpoint.folder_name(160))
    assert files.read_json(workdir / "train" / "DONE.json")["train_steps"] == 160


def test_disk_full_during_a_shard_write_then_the_rerun_completes(tokenized, tmp_path):
    workdir = tmp_path / "run"
    tokenizer_model = RunPaths.of(tokenized.workdir).tokenizer_model
    corpus = RunPaths.of(tokenized.workdir).builtin_corpus
    command = [
        f"workdir={workdir}",
        "stages=[tokenize]",
        f"data.inputs=[{corpus}]",
        "data.num_shards=2",
        f"tokenizer.model={tokenizer_model}",
    ]
    full = cli(*command, preexec_fn=limit_file_size(100_000))  # a shard is ~300 kB
    assert full.returncode == 1
    line = error_line(full.stderr)
    data = RunPaths.of(workdir).data_dir
    assert line.startswith(f"error: no space left writing shard 0 ({data}): File too large")
    assert not list(workdir.glob("data/**/*.partial.*")), "partial shard files are removed"
    tokenizer_before = snapshot(workdir / "tokenizer")

    rerun = cli(*command)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "already complete: tokenizer" in rerun.stderr
    assert snapshot(workdir / "tokenizer") == tokenizer_before
    for index in range(2):  # the same bytes as a run that never ran out of space
        ours = files.read_json(RunPaths.of(workdir).shard_marker(index))
        reference = files.read_json(RunPaths.of(tokenized.workdir).shard_marker(index))
        assert ours["files"] == reference["files"]  # every split's sizes and sha256
