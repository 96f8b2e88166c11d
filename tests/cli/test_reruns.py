"""Reruns on an existing run folder, as a new user makes them: more steps continue, a change
that would mix two runs in one folder is refused in one line and writes nothing, force redoes
and keeps what it replaces, an evaluation alone reads the split the data was made with, and
`make status` says what each step was made from. No figure may come from outputs made with
other settings than those reported."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from tests.conftest import SMALL_SERIAL, cli, lock_held, loss_curve, module

SPLIT = "data.split='80,10,10'"  # not the default: a rerun that forgets it must not re-cut


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("reruns") / "run"
    result = cli(f"workdir={workdir}", *SMALL_SERIAL, SPLIT)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.fixture
def run(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def state(workdir: Path) -> dict[str, int]:
    """Every file of the run folder with its modification time."""
    return {str(p.relative_to(workdir)): p.stat().st_mtime_ns for p in workdir.rglob("*")}


def summary(workdir: Path) -> dict:
    return json.loads((workdir / "summary.json").read_text())


def test_more_steps_continue_from_the_last_checkpoint_and_redo_the_evaluation(run):
    result = cli(f"workdir={run}", "train.steps=30")  # nothing else: the run's settings hold
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already complete: tokenizer, tokenize, verify\n" in result.stderr
    assert "train continues from its output: made with train.steps=20 (now 30)" in result.stderr
    assert f"resumed from {run / 'checkpoints' / 'iter_0000020'} at step 20" in result.stderr
    assert "evaluate is redone: what it read changed (train" in result.stderr
    assert sorted(loss_curve(run)) == [5, 10, 15, 20, 25, 30]
    paths = RunPaths.of(run)
    train = json.loads(paths.train_done.read_text())
    evaluation = json.loads(paths.eval_done.read_text())
    assert train["train_steps"] == summary(run)["train_steps"] == 30
    assert evaluation["made_from"]["inputs"]["train"] == train["fingerprint"]
    assert (
        evaluation["checkpoint_step"] == 30 and summary(run)["test_ppl"] == evaluation["test_ppl"]
    )
    records = [json.loads(line) for line in paths.runs.read_text().splitlines()]
    assert len(records) == 2 and "train.steps=30" in records[-1]["overrides"]
    assert records[-1]["steps"]["train"] == "continue" and SPLIT in records[-1]["overrides"]


@pytest.mark.parametrize(
    "change,step,key",
    [
        ("model.hidden_size=128", "train", "model.hidden_size=64 (now 128)"),
        ("train.lr=0.001", "train", "train.lr=0.003 (now 0.001)"),
        ("train.seed=7", "train", "train.seed=1234 (now 7)"),
        ("train.steps=10", "train", "train.steps=20 (now 10)"),
        ("tokenizer.vocab_size=1024", "tokenizer", "tokenizer.vocab_size=512 (now 1024)"),
        ("data.split='90,5,5'", "tokenize", "data.split=80,10,10 (now 90,5,5)"),
    ],
)
def test_a_change_the_outputs_cannot_follow_is_refused_and_writes_nothing(run, change, step, key):
    before = state(run)
    result = cli(f"workdir={run}", change)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {step}: its output in {run} was made with ")
    assert key in result.stderr
    assert result.stderr.endswith(
        f"give the recorded value, use a new workdir, or force={step} to redo {step} and the "
        "steps after it\n"
    )
    assert state(run) == before, "a refused command writes nothing"


def test_force_redoes_the_step_and_what_follows_and_keeps_what_it_replaces(run):
    before = summary(run)
    result = cli(f"workdir={run}", "model.hidden_size=128", "force=train")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already complete: tokenizer, tokenize, verify, index\n" in result.stderr
    assert "train is redone (force)" in result.stderr and "resumed from" not in result.stderr
    [replaced] = (run / "replaced").iterdir()
    assert (replaced / "checkpoints" / "iter_0000020").is_dir()
    assert json.loads((replaced / "summary.json").read_text()) == before
    assert summary(run)["test_ppl"] != before["test_ppl"]
    again = cli(f"workdir={run}")  # the new model is the run's now
    assert "already complete: tokenizer, tokenize, verify, index, train, evaluate" in again.stderr


def test_an_evaluation_alone_reads_the_split_the_data_was_made_with(run):
    before = summary(run)
    (run / "eval" / "DONE.json").unlink()
    alone = cli(f"workdir={run}", "stages=[evaluate]")
    assert alone.returncode == 0, alone.stderr[-3000:]
    after = summary(run)
    assert (after["test_ppl"], after["test_tokens"]) == (before["test_ppl"], before["test_tokens"])
    assert "split: 80,10,10" in (run / "config.yaml").read_text()
    resplit = cli(f"workdir={run}", "stages=[evaluate]", "data.split='90,5,5'")
    assert resplit.returncode == 2
    assert (
        "error: tokenize: its output" in resplit.stderr
        and "(with tokenize in stages)" in resplit.stderr
    )
    assert summary(run) == after


def test_a_continued_training_drops_the_evaluation_of_the_earlier_model_from_the_summary(run):
    result = cli(f"workdir={run}", "stages=[train]", "train.steps=30")
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary(run)["train_steps"] == 30 and "test_ppl" not in summary(run)
    assert "the evaluation in eval/ is of an earlier training" in (run / "report.md").read_text()


def status(*args: str) -> subprocess.CompletedProcess:
    return module("pipeline.status", *args, timeout=120)


def test_status_says_what_each_step_was_made_from_and_why_one_failed(run, tmp_path):
    nothing = status(f"workdir={tmp_path / 'nothing'}")
    assert nothing.returncode == 2 and nothing.stderr.startswith("error: workdir: ")
    assert "holds no run" in nothing.stderr and nothing.stderr.count("\n") == 1
    complete = status(f"workdir={run}")
    assert complete.returncode == 0 and complete.stdout.count(" COMPLETE ") == 6
    changed = status(f"workdir={run}", "train.lr=0.1")
    assert changed.returncode == 1
    assert "train      REFUSED        made with train.lr=0.003 (now 0.1)" in changed.stdout
    for folder in (run / "checkpoints").glob("iter_*"):
        shutil.rmtree(folder)  # the evaluation finds no checkpoint: it fails
    (run / "eval" / "DONE.json").unlink()
    assert cli(f"workdir={run}", "stages=[evaluate]").returncode != 0
    failed = status(f"workdir={run}")
    assert failed.returncode == 1
    row = next(line for line in failed.stdout.splitlines() if line.strip().startswith("evaluate"))
    assert "FAILED" in row and "no valid checkpoint" in row


def as_written_by_0_6(run: Path) -> None:
    """The run folder's config.yaml and runs.jsonl with the fault-tolerance keys under the
    names 0.6 gave them (cluster.*, train.*), and a setting of one given on its command line."""
    from omegaconf import OmegaConf

    from pipeline.config.renames import RENAMED

    saved = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    moved = saved.pop("resilience")
    for old, new in RENAMED.items():
        section, leaf = old.split(".")
        saved[section][leaf] = moved[new.split(".")[1]]
    saved["train"]["max_failed_saves"] = 4
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(saved)))
    lines = (run / "runs.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["overrides"].append("train.max_failed_saves=4")
    (run / "runs.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")


def test_a_run_folder_of_0_6_with_the_old_key_names_reruns_as_complete(run):
    as_written_by_0_6(run)
    assert status(f"workdir={run}").stdout.count(" COMPLETE ") == 6
    result = cli(f"workdir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already complete: tokenizer, tokenize, verify, index, train, evaluate\n" in (
        result.stderr
    )
    assert "warning: " not in result.stderr  # the user gave no old name
    # the value recorded under the old name is kept, under the new one
    assert json.loads((run / "runs.jsonl").read_text().splitlines()[-1])["overrides"][-1] == (
        "resilience.max_failed_saves=4"
    )
    assert "  max_failed_saves: 4\n" in (run / "config.yaml").read_text().split("resilience:")[1]


def test_status_names_the_step_a_live_launcher_runs_and_its_pid(run):
    """While a launcher holds the run folder (here one that holds its lock as a launch does),
    the first step it has not completed is RUNNING with its pid, not 'run make pretrain',
    which would be refused; once it is gone the step is what its outputs say."""
    (run / "eval" / "DONE.json").unlink()
    with lock_held(run) as holder:
        live = status(f"workdir={run}")
    assert live.returncode == 0, live.stderr
    row = next(x for x in live.stdout.splitlines() if x.strip().startswith("evaluate"))
    assert row.split()[1] == "RUNNING" and f"pid {holder.pid} on " in row, live.stdout
    after = status(f"workdir={run}")
    row = next(x for x in after.stdout.splitlines() if x.strip().startswith("evaluate"))
    assert "RUNNING" not in row and "make pretrain" in row, after.stdout


def test_status_names_the_run_folder_to_rerun_and_the_step_a_running_training_is_at(run):
    """`make pretrain` alone runs the default workdir, another folder: the status of a run
    elsewhere names its own; a training the launcher is running shows the step its ranks
    report (train/progress/), not that of an earlier attempt."""
    from pipeline.resilience.progress import Reporter

    paths = RunPaths.of(run)
    paths.train_done.unlink()
    (run / "eval" / "DONE.json").unlink()
    Reporter(paths.progress, 0).phase("validate", 20)  # the attempt before: stale
    idle = status(f"workdir={run}")
    row = next(x for x in idle.stdout.splitlines() if x.strip().startswith("evaluate"))
    assert f"run `make pretrain ARGS=workdir={run}` to run it" in row, idle.stdout
    with lock_held(run):
        starting = status(f"workdir={run}")
        Reporter(paths.progress, 0).phase("forward-backward", 7)
        live = status(f"workdir={run}")
    row = next(x for x in starting.stdout.splitlines() if x.strip().startswith("train"))
    assert row.split()[1] == "RUNNING" and "at step" not in row, starting.stdout
    row = next(x for x in live.stdout.splitlines() if x.strip().startswith("train"))
    assert row.endswith("; at step 7 of 20 (forward-backward)"), live.stdout
