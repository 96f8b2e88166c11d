"""Experiment tracking, with no network: W&B offline and MLflow's local file store receive what
train/metrics.jsonl holds, the config, the test results and the report, read back with each
library's own reader; a resumed and a continued training stay in one tracker run; no API key
reaches a file; a run that enables neither imports neither."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.evaluation.steps import EVALUATE
from pipeline.training import checkpoint
from pipeline.training.steps import TRAIN
from tests.conftest import ROOT, SMALL_SERIAL, changed, copy_tokenized, make_config
from tests.unit.test_tracking import TRACKED, wandb_records

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

CANARY = "canary0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8"  # 40 characters, as W&B keys are


def expected_metrics(paths: RunPaths) -> dict[tuple[int, str], float]:
    """(step, key) -> value of every number train/metrics.jsonl holds, as TensorBoard
    receives them."""
    out = {}
    for line in paths.metrics.read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                out[(record["step"], key)] = float(value)
    return out


def wandb_metrics(records: list[dict]) -> dict[tuple[int, str], float]:
    out = {}
    for r in records:
        if r["type"] == "history":
            item = r["history"]["item"]
            for key, value in item.items():
                if not key.startswith("_") and key != "step":
                    out[(item["step"], key)] = float(value)
    return out


def mlflow_metrics(client, run_id: str) -> dict[tuple[int, str], float]:
    out = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):  # in the order logged: the last wins
            out[(m.step, key)] = m.value
    return out


def test_trackers_receive_the_metrics_config_results_and_report_of_one_run(
    tokenized, tmp_path, monkeypatch, capfd
):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_API_KEY", CANARY)
    cfg = make_config(copy_tokenized(tokenized, tmp_path), *SMALL_SERIAL, *TRACKED)
    paths = RunPaths.of(cfg.workdir)
    TRAIN.run(cfg)
    first = files.read_json(paths.tracking)
    held = expected_metrics(paths)  # what the trackers hold before the requeue
    # killed after step 10's checkpoint, requeued: the same tracker runs go on
    shutil.rmtree(paths.checkpoints / checkpoint.folder_name(20))
    paths.train_done.unlink()
    TRAIN.run(cfg)
    continued = changed(cfg, "train", steps=30)  # more train.steps
    TRAIN.run(continued)
    evaluation = EVALUATE.run(continued)
    assert files.read_json(paths.tracking) == first

    # a step the requeued attempt did again is not sent again: the trackers keep the first
    expected = {**expected_metrics(paths), **held}
    assert {key for _, key in expected} >= {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s"}
    assert {key for _, key in expected} >= {"tflops_per_gpu", "resume_load_s"}
    assert {"checkpoint_blocked_s", "skipped_steps"} <= {key for _, key in expected}
    assert max(step for step, _ in expected) == 30

    # W&B: one run id over three training attempts and the evaluation
    records = wandb_records(paths)
    runs = [r["run"] for r in records if r["type"] == "run"]
    assert len(runs) == 4 and {r["run_id"] for r in runs} == {first["wandb"]["id"]}
    assert wandb_metrics(records) == pytest.approx(expected, rel=1e-12)
    config = {}
    for r in runs:
        config.update(r["config"]["update"])
    assert config["train.lr"] == cfg.train.lr and config["model.hidden_size"] == 64
    assert config["fingerprint.train"] == files.read_json(paths.train_done)["fingerprint"]
    nodes = {r["node"] for a in files.read_json(paths.ranks)["attempts"] for r in a["ranks"]}
    assert config["nodes"] == ",".join(sorted(nodes)) and config["workdir"] == str(paths.root)
    summary = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"]["update"])
    assert summary["test/loss"] == pytest.approx(evaluation["test_loss"], rel=1e-12)
    uploaded = {
        entry["path"]
        for r in records
        if r["type"] == "artifact"
        for entry in r["artifact"]["manifest"]["contents"]
    }
    assert {"report.md", "report.html", "summary.json", "train/loss.png"} <= uploaded

    # MLflow: the same, from its file store in the run folder
    client = MlflowClient(tracking_uri=first["mlflow"]["tracking_uri"])
    run_id = first["mlflow"]["run_id"]
    assert first["mlflow"]["tracking_uri"] == (paths.root / "mlruns").as_uri()
    measured = mlflow_metrics(client, run_id)
    assert {k: v for k, v in measured.items() if not k[1].startswith("test")} == pytest.approx(
        expected, rel=1e-12
    )
    assert measured[(evaluation["checkpoint_step"], "test/loss")] == pytest.approx(
        evaluation["test_loss"], rel=1e-12
    )
    run = client.get_run(run_id)
    assert run.data.params["train.lr"] == str(cfg.train.lr)
    assert run.data.params["train.steps"] == "20"  # MLflow keeps a parameter's first value
    assert run.data.tags["config.train.steps"] == "30"
    assert run.data.tags["fingerprint.evaluate"] == evaluation["fingerprint"]
    assert run.data.tags["nodes"] == config["nodes"]
    assert run.info.status == "FINISHED"
    listed = {a.path for a in client.list_artifacts(run_id)}
    listed |= {a.path for a in client.list_artifacts(run_id, "train")}
    assert {"report.md", "summary.json", "train/loss.png"} <= listed
    assert len(client.search_runs([run.info.experiment_id])) == 1

    # no API key in any file of the run folder, nor in what the run printed
    printed = capfd.readouterr()
    assert CANARY not in printed.out + printed.err
    for path in paths.root.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path
    assert "wandb sync" in printed.err


def test_a_run_without_trackers_loads_and_mentions_neither(tokenized, tmp_path):
    """The pipeline's tracker code and MLflow stay unloaded. (megatron-core imports wandb
    itself whenever it is installed; it starts no W&B run.)"""
    workdir = copy_tokenized(tokenized, tmp_path)
    script = (
        "import sys\n"
        "from tests.conftest import SMALL_SERIAL, make_config\n"
        "from pipeline.training.steps import TRAIN\n"
        "from pipeline.evaluation.steps import EVALUATE\n"
        f"cfg = make_config({str(workdir)!r}, *SMALL_SERIAL, 'train.steps=5', "
        "'train.save_interval=5', 'train.eval_interval=5', 'eval.max_batches=1', "
        "'eval.max_new_tokens=4')\n"
        "TRAIN.run(cfg)\n"
        "EVALUATE.run(cfg)\n"
        "ours = ('pipeline.tracking.wandb_run', 'pipeline.tracking.mlflow_run', 'mlflow')\n"
        "loaded = sorted(m for m in sys.modules if m in ours or m.startswith('mlflow.'))\n"
        "assert not loaded, loaded\n"
        "assert 'wandb' not in sys.modules or sys.modules['wandb'].run is None\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wandb" not in done.stderr.lower() and "mlflow" not in done.stderr.lower()
    assert not [p.name for p in workdir.iterdir() if p.name in ("tracking.json", "wandb", "mlruns")]


def test_tensorboard_holds_each_key_once_a_step(tmp_path):
    """A validation step's record and its training line both carry `tokens`: TensorBoard gets
    it once at that step, and every other key as logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from pipeline.training.metrics import MetricsLog

    paths = RunPaths.of(tmp_path)
    paths.metrics.parent.mkdir(parents=True)
    log = MetricsLog(paths, enabled=True)
    log.open_tensorboard(resumed_at=0)
    log.record({"step": 10, "loss": 3.0, "tokens": 640})
    log.record({"step": 10, "val_loss": 3.5, "tokens": 640})
    log.record({"step": 20, "loss": 2.5, "tokens": 1280})
    log.close()
    board = EventAccumulator(str(paths.tensorboard))
    board.Reload()
    steps = {key: [e.step for e in board.Scalars(key)] for key in board.Tags()["scalars"]}
    assert steps == {"loss": [10, 20], "val_loss": [10], "tokens": [10, 20]}, steps


def test_a_scoring_job_logs_into_the_runs_tracker_at_the_checkpoints_step(tmp_path, monkeypatch):
    """The downstream job's scores, in the training's MLflow run and TensorBoard, at the step
    of the checkpoint it scored (the training has logged later steps meanwhile)."""
    from pipeline.evaluation import checkpoint_scoring
    from pipeline.tracking.trackers import Trackers

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = make_config(
        tmp_path / "run", "logging.mlflow.enabled=true", f"logging.mlflow.tracking_uri={uri}"
    )
    paths = RunPaths.of(cfg.workdir)
    paths.root.mkdir(parents=True)
    training = Trackers.open(cfg, paths)  # the training's run, which the scoring job continues
    training.log({"step": 20, "loss": 5.0})
    training.finish()
    record = {"step": 10, "tasks": {"tiny_choice": {"acc,none": 0.5, "acc_stderr,none": 0.2}}}
    values = checkpoint_scoring.flat(record)
    assert values == {"downstream/tiny_choice/acc": 0.5}
    checkpoint_scoring._to_trackers(cfg, paths, 10, values)
    from mlflow.tracking import MlflowClient

    saved = json.loads(paths.tracking.read_text())["mlflow"]
    client = MlflowClient(tracking_uri=saved["tracking_uri"])
    history = client.get_metric_history(saved["run_id"], "downstream/tiny_choice/acc")
    assert [(m.step, m.value) for m in history] == [(10, 0.5)]
    assert list((paths.tensorboard / "downstream").glob("events.out.tfevents.*"))
