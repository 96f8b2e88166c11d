"""The training loop on CPU: the model learns, checkpoints resume the exact loss curve, and
damaged checkpoints are never loaded."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys

import pytest

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data import datasets
from pipeline.evaluation.steps import EVALUATE
from pipeline.training import checkpoint
from pipeline.training.steps import TRAIN
from tests.conftest import (
    ROOT,
    SMALL,
    SMALL_SERIAL,
    changed,
    copy_tokenized,
    make_config,
    trainer_of,
)


def _losses(cfg) -> dict[int, float]:
    lines = RunPaths.of(cfg.workdir).metrics.read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def test_loss_falls_on_a_fixed_batch(run_copy):
    cfg = changed(
        run_copy, "train", steps=200
    )  # keep the learning rate up: the schedule spans the run
    trainer = trainer_of(cfg)
    dataset = datasets.train_dataset(cfg)
    batch = next(iter(trainer.iterators(dataset, 0, cfg.train.micro_batch_size)[0]))
    losses = [trainer.iteration([itertools.repeat(batch)])[0] for _ in range(40)]
    assert losses[-1] < 0.3 * losses[0], losses


def test_resume_from_a_checkpoint_reproduces_the_loss_curve(run_copy):
    cfg = changed(run_copy, "train", log_interval=1)
    first = TRAIN.run(cfg)
    assert first["status"] == "complete"
    uninterrupted = _losses(cfg)
    assert sorted(uninterrupted) == list(range(1, cfg.train.steps + 1))

    paths = RunPaths.of(cfg.workdir)
    shutil.rmtree(paths.checkpoints / checkpoint.folder_name(20))  # as if killed after step 10
    paths.train_done.unlink()
    paths.metrics.unlink()
    resumed = TRAIN.run(cfg)
    assert resumed["status"] == "complete"
    replay = _losses(cfg)
    assert sorted(replay) == list(range(11, 21))
    assert all(replay[s] == uninterrupted[s] for s in replay), (replay, uninterrupted)


def test_best_checkpoint_has_the_lowest_validation_loss_and_survives_retention(run_copy):
    cfg = changed(run_copy, "train", steps=30, keep_last=1)
    TRAIN.run(cfg)
    root = RunPaths.of(cfg.workdir).checkpoints
    saved = sorted(p.name for p in root.glob("iter_*"))
    best = files.read_json(root / checkpoint.BEST)
    assert best["name"] in saved
    assert saved[-1] == checkpoint.folder_name(30)
    assert len(saved) <= 2  # the newest, plus the best if it is another
    metrics = [
        json.loads(line) for line in RunPaths.of(cfg.workdir).metrics.read_text().splitlines()
    ]
    val = {r["step"]: r["val_loss"] for r in metrics if "val_loss" in r}
    assert best["val_loss"] == min(val[s] for s in (10, 20, 30))
    result = EVALUATE.run(cfg)
    assert result["checkpoint"] == str(root / best["name"])
    assert result["test_ppl"] < 512  # far below the vocabulary size


def test_damaged_or_incomplete_checkpoints_are_skipped(run_copy):
    cfg = run_copy
    TRAIN.run(cfg)
    root = RunPaths.of(cfg.workdir).checkpoints
    newest = root / checkpoint.folder_name(20)
    older = root / checkpoint.folder_name(10)
    assert checkpoint.latest(root) == newest
    model_file = newest / "dist" / "__0_0.distcp"
    model_file.write_bytes(model_file.read_bytes()[:100])  # truncated
    with pytest.warns(UserWarning, match="incomplete or damaged"):
        assert checkpoint.latest(root) == older
    (root / "iter_0000030").mkdir()  # a save that died before COMPLETE.json
    with pytest.warns(UserWarning):
        assert checkpoint.latest(root) == older


def test_a_warning_before_training_starts_is_saved_at_the_first_step(run_copy):
    """Slurm may send the time-limit warning a minute early, while the job still imports: the
    job records it from its start and saves at its first step, asking to be requeued."""
    code = (
        "import os, signal, sys\n"
        "from pipeline import config\n"
        "from pipeline.training import signals\n"
        "from pipeline.training.steps import TRAIN\n"
        "signals.listen()\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "cfg = config.compose(*sys.argv[1:])\n"
        "print(repr(TRAIN.run(cfg)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, run_copy.workdir, *SMALL_SERIAL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "Interrupted(at_step=1, requeue=True)"
    assert "SIGUSR2: saved step 1, exiting for requeue" in done.stderr
    paths = RunPaths.of(run_copy.workdir)
    assert checkpoint.latest(paths.checkpoints) == paths.checkpoints / checkpoint.folder_name(1)


def test_a_squared_relu_model_trains_and_its_export_is_refused_in_one_line(tokenized, tmp_path):
    """model.activation=squared_relu (tests/integration/test_model.py checks its MLP) learns on
    CPU; no transformers model computes it, so the export names the key before it reads
    anything."""
    workdir = copy_tokenized(tokenized, tmp_path / "run")
    squared = ["model.activation=squared_relu", "train.steps=10", "train.log_interval=1"]
    cfg = make_config(workdir, *SMALL, *squared)
    assert TRAIN.run(cfg)["status"] == "complete"
    losses = _losses(cfg)
    assert sum(losses[s] for s in (8, 9, 10)) < sum(losses[s] for s in (1, 2, 3)), losses
    out = tmp_path / "export"
    # trained in this process, the run has no history to replay: its settings are given again
    export = ["-m", "pipeline.export", f"workdir={workdir}", f"out={out}", *SMALL, *squared]
    refused = subprocess.run(
        [sys.executable, *export],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("error: model.activation=squared_relu: no transformers")
    assert not out.exists() and not out.with_name("export.partial").exists()
