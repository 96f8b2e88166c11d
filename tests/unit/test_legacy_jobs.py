"""Jobs queued by version 0.1 (before the package layout) still run after an upgrade.

legacy_jobs/ holds the job pickles 0.1 wrote for each step of a run (as submitit writes them,
`<job id>_submitted.pkl`), made by 0.1 itself for workdir=legacy-run (relative: the job's
working folder). They name 0.1's modules (pipeline.jobs, pipeline.tokenize, ...) and hold the
config as a DictConfig."""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission

from pipeline import config, legacy
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.steps import TOKENIZE

PICKLES = Path(__file__).parent / "legacy_jobs"
STEPS = ["tokenizer", "tokenize", "verify", "index", "train", "evaluate"]


@pytest.mark.parametrize("step", STEPS)
def test_each_queued_job_loads_as_the_same_step_of_this_version(step):
    job = DelayedSubmission.load(PICKLES / f"{step}_submitted.pkl")
    kind = legacy.ArrayTask if step == "tokenize" else legacy.DistributedTask
    assert isinstance(job.function, kind)
    assert job.function.fn.step == step
    cfg = config.typed(job.function.cfg)
    assert cfg.workdir == "legacy-run" and cfg.train.grad_accum == 2  # as 0.1 resolved it
    assert job.args == ((0,) if step == "tokenize" else ())


def run_job(folder: Path, job_id: str, step: str, cwd: Path) -> tuple[str, object]:
    """Run a queued job as submitit's job runner does on the node, in `cwd`."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(PICKLES / f"{step}_submitted.pkl", folder / f"{job_id}_submitted.pkl")
    env = {
        **os.environ,
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": job_id,
        "SUBMITIT_LOCAL_NTASKS": "1",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_GLOBALID": "0",
        "SUBMITIT_LOCAL_LOCALID": "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "submitit.core._submit", str(folder)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(folder / f"{job_id}_0_result.pkl", "rb") as f:
        return pickle.load(f)


def test_queued_tokenizer_and_tokenize_jobs_run_their_steps(tmp_path):
    """What 0.1's launcher had done before submitting (the built-in corpus and the shard
    plan, the same files in 0.2), then the queued jobs start after the upgrade."""
    queued = config.typed(DelayedSubmission.load(PICKLES / "tokenize_submitted.pkl").function.cfg)
    cwd = tmp_path / "node"  # where the jobs run: their workdir, legacy-run, is relative to it
    paths = RunPaths.of(cwd / queued.workdir)
    TOKENIZE.prepare(dataclasses.replace(queued, workdir=str(paths.root)))
    status, meta = run_job(tmp_path / "jobs", "101", "tokenizer", cwd)
    assert status == "success" and meta["trained"] and meta["vocab_size"] == 512
    assert files.read_json(paths.tokenizer_meta)["sha256"] == files.sha256(paths.tokenizer_model)
    status, marker = run_job(tmp_path / "jobs", "102", "tokenize", cwd)
    assert status == "success" and marker["shard"] == 0 and marker["documents"] > 0
    assert files.read_json(paths.shard_marker(0)) == marker
