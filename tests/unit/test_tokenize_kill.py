"""A tokenize task killed mid-write leaves nothing a later step would read, and its rerun
writes the same bytes as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline import files, shards, tokenize, tokenizer
from pipeline.layout import RunLayout
from tests.conftest import CONF


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
    source = Path(shards.input_paths(tokenized)[0]).read_text()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(source * 40)  # tens of MB: seconds of tokenizing
    model = tokenizer.model_path(tokenized)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _tokenize_command(killed, corpus, model),
        cwd=CONF.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    data_dir = RunLayout.of(str(killed)).data_dir
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        written = [
            p
            for p in data_dir.glob("*")
            if p.name != "plan.json" and p.is_file() and p.stat().st_size > 1 << 20
        ]
        if written:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the task finished before it could be killed: use more data"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    prefix = RunLayout.of(str(killed)).shard_prefix(0)
    assert not tokenize.is_shard_complete(prefix)
    assert not tokenize.marker_path(prefix).exists()
    assert not RunLayout.of(str(killed)).manifest.exists()

    clean = tmp_path / "clean"
    for workdir in (killed, clean):  # resume the killed run; tokenize afresh for comparison
        subprocess.run(
            _tokenize_command(workdir, corpus, model),
            cwd=CONF.parent,
            check=True,
            capture_output=True,
            timeout=600,
        )
    resumed_marker = files.read_json(tokenize.marker_path(prefix))
    clean_marker = files.read_json(tokenize.marker_path(RunLayout.of(str(clean)).shard_prefix(0)))
    for key in ("bin_sha256", "idx_sha256", "documents", "tokens"):
        assert resumed_marker[key] == clean_marker[key], key
    assert files.sha256(f"{prefix}.bin") == clean_marker["bin_sha256"]
