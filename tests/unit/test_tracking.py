"""The trackers without a training: a sweep's points grouped as one sweep, a tracker package
missing, and trackers that cannot be reached (no network needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.tracking.trackers import Trackers
from tests.conftest import make_config

TRACKED = ("logging.wandb.mode=offline", "logging.mlflow.enabled=true")


def _tracked_run(workdir: Path, *overrides: str) -> RunPaths:
    """A tracker run opened as a training opens it, given one record, then finished."""
    cfg = make_config(workdir, *overrides)
    paths = RunPaths.of(workdir)
    paths.root.mkdir(parents=True, exist_ok=True)
    trackers = Trackers.open(cfg, paths)
    trackers.log({"step": 1, "loss": 5.0, "kernels": "local"})
    trackers.finish()
    return paths


def wandb_records(paths: RunPaths) -> list[dict]:
    """Every record of the run's offline W&B files, attempt by attempt, as `wandb leet
    inspect` (W&B's reader of its .wandb transaction logs) reads them."""
    reader = Path(sys.executable).parent / "wandb"
    records = []
    for folder in sorted((paths.root / "wandb").glob("offline-run-*")):
        out = subprocess.run(
            [str(reader), "leet", "inspect", "--json", str(folder)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        records += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return records


def _wandb_run_record(paths: RunPaths) -> dict:
    """The run record of the one offline W&B run in the run folder."""
    assert len(list((paths.root / "wandb").glob("offline-run-*"))) == 1
    return next(r["run"] for r in wandb_records(paths) if r["type"] == "run")


def test_the_points_of_a_sweep_share_a_group_and_a_store(tmp_path):
    pytest.importorskip("wandb")
    from mlflow.tracking import MlflowClient

    sweep = tmp_path / "base" / "sweep"
    points = []
    for lr in ("0.001", "0.002"):
        files.write_json(sweep / f"lr-{lr}" / "sweep_point.json", {"overrides": [f"train.lr={lr}"]})
        points.append(_tracked_run(sweep / f"lr-{lr}", *TRACKED, f"train.lr={lr}"))
    groups = {_wandb_run_record(p)["run_group"] for p in points}
    assert len(groups) == 1 and groups.pop().startswith("base-sweep-")
    stores = {files.read_json(p.tracking)["mlflow"]["tracking_uri"] for p in points}
    assert stores == {(sweep / "mlruns").as_uri()}
    client = MlflowClient(tracking_uri=stores.pop())
    runs = client.search_runs([client.get_experiment_by_name("pipeline").experiment_id])
    assert len(runs) == 2 and len({r.data.tags["sweep"] for r in runs}) == 1
    assert {r.data.params["train.lr"] for r in runs} == {"0.001", "0.002"}


def test_a_tracker_not_installed_costs_one_line_and_nothing_else(tmp_path, monkeypatch, capfd):
    for name in [m for m in sys.modules if m.split(".")[0] in ("wandb", "mlflow")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets uninstalled
    monkeypatch.setitem(sys.modules, "mlflow", None)
    cfg = make_config(tmp_path, *TRACKED)
    trackers = Trackers.open(cfg, RunPaths.of(tmp_path))
    assert trackers.opened == []
    trackers.log({"step": 1, "loss": 5.0})
    trackers.finish()
    lines = capfd.readouterr().err.splitlines()
    assert lines == [
        "logging.wandb.mode=offline: wandb is not installed (pip install wandb); going on without",
        "logging.mlflow.enabled=true: mlflow is not installed (pip install mlflow-skinny); "
        "going on without",
    ]
    assert not (tmp_path / "tracking.json").exists()


def test_trackers_that_cannot_be_reached_log_to_the_run_folder(
    tmp_path, monkeypatch, capfd, request
):
    wandb = pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    wandb.teardown()  # W&B reads its environment once a process, as a job starts
    request.addfinalizer(wandb.teardown)
    paths = _tracked_run(
        tmp_path,
        "logging.wandb.mode=online",
        "logging.mlflow.enabled=true",
        "logging.mlflow.tracking_uri=http://127.0.0.1:9",
    )
    err = capfd.readouterr().err
    assert f"wandb sync {tmp_path / 'wandb'}/offline-run-*" in err
    assert "logging.mlflow.tracking_uri: 127.0.0.1 does not answer" in err
    assert _wandb_run_record(paths)["run_id"] == files.read_json(paths.tracking)["wandb"]["id"]
    local = files.read_json(paths.tracking)["mlflow"]
    assert local["tracking_uri"] == (tmp_path / "mlruns").as_uri()
    from mlflow.tracking import MlflowClient

    history = MlflowClient(local["tracking_uri"]).get_metric_history(local["run_id"], "loss")
    assert [(m.step, m.value) for m in history] == [(1, 5.0)]


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "HF_token"])
def test_a_secret_in_cluster_env_is_refused_before_it_reaches_a_file(tmp_path, name):
    with pytest.raises(ConfigError, match=rf"^cluster\.env\.{name}: a secret\? export it"):
        make_config(tmp_path, f"+cluster.env.{name}=canary")
    assert list(tmp_path.iterdir()) == []
