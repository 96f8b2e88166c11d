"""Where a new user points the pipeline, and what is not there: folders that are files, a
checkpoint path that names nothing, Slurm commands on a laptop, a corpus of empty files. Each
mistake is one line, exit 2, before anything is written; the dry run that prints job scripts
needs no Slurm."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL_SERIAL, cli, module

VENV_BIN = str(Path(sys.executable).parent)  # python and its tools; no Slurm command


def refused(result: subprocess.CompletedProcess, line: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == f"error: {line}\n" and "Traceback" not in result.stderr


def test_a_workdir_that_is_a_file_or_under_one_is_refused(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("not a run folder")
    refused(cli(f"workdir={afile}"), f"workdir: {afile} is a file, not a folder")
    refused(
        cli(f"workdir={afile}/run"),
        f"workdir: {afile}/run: {afile}, in its path, is a file, not a folder",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def export(*args: str) -> subprocess.CompletedProcess:
    return module("pipeline.export", *args)


@pytest.fixture(scope="module")
def trained(finished_run, tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("places") / "run"
    shutil.copytree(finished_run.workdir, workdir, symlinks=True)
    return workdir


def state(workdir: Path) -> dict[str, int]:
    """Every file of the run folder with its modification time."""
    return {str(p.relative_to(workdir)): p.stat().st_mtime_ns for p in workdir.rglob("*")}


def test_export_paths_that_name_nothing_usable_are_one_line_naming_the_path(trained, tmp_path):
    afile = tmp_path / "model.bin"
    afile.write_text("x")
    checkpoints = trained / "checkpoints"
    newest = sorted(checkpoints.glob("iter_*"))[-1]
    cases = [
        (("eval.checkpoint=/does/not/exist",), "eval.checkpoint: /does/not/exist does not exist"),
        (
            (f"eval.checkpoint={checkpoints}",),
            f"eval.checkpoint: {checkpoints} is a folder of checkpoints; give one of them "
            f"({newest}), best or latest",
        ),
        ((f"out={afile}",), f"export.out: {afile} is a file, not a folder"),
        (
            (f"out={afile}/hf",),
            f"export.out: {afile}/hf: {afile}, in its path, is a file, not a folder",
        ),
    ]
    before = state(trained)
    for args, line in cases:
        refused(export(f"workdir={trained}", *args), line)
    assert state(trained) == before and afile.read_text() == "x"
    partial = tmp_path / "partial"
    partial.mkdir()  # a folder, but no checkpoint in it
    result = export(f"workdir={trained}", f"eval.checkpoint={partial}")
    refused(
        result,
        f"eval.checkpoint: {partial} is not a whole, valid checkpoint (no COMPLETE.json: the "
        "save did not finish)",
    )


def test_an_evaluation_of_a_checkpoint_path_that_does_not_exist_is_one_line(trained):
    before = state(trained)
    result = cli(f"workdir={trained}", "stages=[evaluate]", "eval.checkpoint=/no/such/iter")
    refused(
        result, "eval.checkpoint: '/no/such/iter' is neither best, latest nor a checkpoint folder"
    )
    assert state(trained) == before, "a refused evaluation writes nothing"


def without_slurm() -> dict[str, str]:
    return {**os.environ, "PATH": VENV_BIN}


def test_submitting_to_slurm_where_there_is_none_is_one_line_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    result = cli(f"workdir={workdir}", "cluster=slurm", env=without_slurm())
    refused(
        result,
        "cluster: cluster=slurm submits jobs to Slurm, but sbatch is not on PATH here; run this "
        "on the cluster's login node, give cluster=local to run here, or dry_run=true to print "
        "the job scripts",
    )
    assert not workdir.exists()


def test_a_dry_run_prints_a_gpu_sites_job_scripts_on_a_machine_without_slurm(tmp_path):
    workdir = tmp_path / "run"
    result = cli(
        f"workdir={workdir}",
        "cluster=gpu-cluster",
        "dry_run=true",
        "train.global_batch_size=128",
        env=without_slurm(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scripts = result.stdout.split("\n# ---- ")[1:]
    assert [s.split(" ----", 1)[0] for s in scripts] == [
        "tokenizer",
        "tokenize",
        "verify",
        "index",
        "train",
        "evaluate",
    ]
    train = next(s for s in scripts if s.startswith("train"))
    assert "#SBATCH --nodes=2" in train and "#SBATCH --gpus-per-node=8" in train
    assert not workdir.exists()


def test_a_corpus_of_empty_files_is_refused_before_a_run_folder_is_made(tmp_path):
    empty = [tmp_path / f"empty{i}.jsonl" for i in range(2)]
    for path in empty:
        path.write_text("")
    workdir = tmp_path / "run"
    result = cli(f"workdir={workdir}", "data=jsonl", f"data.inputs=[{tmp_path}/empty*.jsonl]")
    refused(result, f"data.inputs: all 2 files ({empty[0]}, ...) are empty")
    assert not workdir.exists()


def test_a_run_that_tokenized_nothing_is_rerun_with_other_inputs_without_force(tmp_path):
    """A gzip file of no text passes the size check; the tokenizer finds no record after the run
    folder was made. Nothing was tokenized, so the rerun with the right file simply runs."""
    import gzip
    import json

    nothing = tmp_path / "nothing.jsonl.gz"
    with gzip.open(nothing, "wt") as f:
        f.write("")
    workdir = tmp_path / "run"
    common = [f"workdir={workdir}", *SMALL_SERIAL, "data=jsonl", "stages=[tokenize]"]
    first = cli(*common, f"data.inputs=[{nothing}]")
    assert first.returncode != 0 and first.stderr.strip().splitlines()[-1].startswith(
        "error: data.inputs: the corpus holds no record"
    ), first.stderr[-2000:]
    good = tmp_path / "good.jsonl"
    from pipeline.data import corpus

    good.write_text("".join(json.dumps({"text": t}) + "\n" for t in list(corpus.documents())[:400]))
    second = cli(*common, f"data.inputs=[{good}]")
    assert second.returncode == 0, second.stderr[-2000:]
    manifest = json.loads((workdir / "data" / "manifest.json").read_text())
    assert manifest["total"]["documents"] + manifest["total"]["no_token_documents"] == 400
