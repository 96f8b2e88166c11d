"""A tokenize task killed mid-write leaves nothing a later step would read, and its rerun
writes the same bytes as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data import sources
from tests.conftest import ROOT


def _tokenize_command(workdir: Path, corpus: Path, model: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipeline",
        "cluster=local",
        "stages=[tokenize]",
        f"workdir={workdir}",
        f"data.inputs=[{corpus}]",
        "data.num_shards=1",
        f"tokenizer.model={model}",
        "cluster.cpus_per_task=1",
    ]


def test_killed_task_leaves_nothing_readable_and_rerun_is_identical(tokenized, tmp_path):
    paths = RunPaths.of(tokenized.workdir)
    [(_, first)] = sources.files(paths, tokenized.data)[:1]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(Path(first).read_text() * 40)  # tens of MB: seconds of tokenizing
    model = paths.tokenizer_model

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _tokenize_command(killed, corpus, model),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = RunPaths.of(killed)
    data_dir = run.data_dir
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        written = [
            p
            for p in data_dir.glob("**/*")
            if p.name != "plan.json" and p.is_file() and p.stat().st_size > 1 << 20
        ]
        if written:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the task finished before it could be killed: use more data"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    assert not run.shard_marker(0).exists()  # no marker: the shard is not complete
    assert not run.manifest.exists()

    clean = tmp_path / "clean"
    for workdir in (killed, clean):  # resume the killed run; tokenize afresh for comparison
        subprocess.run(
            _tokenize_command(workdir, corpus, model),
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=600,
        )
    resumed_marker = files.read_json(run.shard_marker(0))
    clean_marker = files.read_json(RunPaths.of(clean).shard_marker(0))
    assert resumed_marker["files"] == clean_marker["files"]  # every split's sizes and sha256
    assert resumed_marker["documents"] == clean_marker["documents"]
    for by_split in clean_marker["files"].values():
        for record in by_split.values():
            assert files.sha256(run.root / f"{record['prefix']}.bin") == record["bin_sha256"]
