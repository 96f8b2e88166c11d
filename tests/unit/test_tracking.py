"""The trackers without a training: a sweep's points grouped as one sweep, a tracker package
missing, and trackers that cannot be reached (no network needed)."""

from __future__ import annotations

import json
import re
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


def _mlflow_history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in client.get_run(run_id).data.metrics
    }


@pytest.mark.parametrize(
    "given, store",
    [
        ("file://{tmp}/file-store", "file-store"),
        ("{tmp}/folder-store", "folder-store"),
        ("relative-store", "relative-store"),
        ("sqlite:///relative.db", "relative.db"),
        ("sqlite:///{tmp}/absolute.db", "absolute.db"),
    ],
)
def test_the_local_mlflow_stores_a_user_would_give_receive_the_run(
    tmp_path, monkeypatch, capfd, given, store
):
    """file: and plain folders (MLflow's file store, which it keeps only on request) and
    SQLite (the store MLflow recommends), absolute or relative to where the run starts."""
    pytest.importorskip("mlflow")
    from pipeline.tracking import settings

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    workdir = tmp_path / "run"
    uri = given.format(tmp=tmp_path)
    cfg = make_config(workdir, "logging.mlflow.enabled=true", f"logging.mlflow.tracking_uri={uri}")
    cfg = settings.checked(cfg, tmp_path)
    monkeypatch.chdir(workdir.parent.parent)  # a job may start elsewhere: the same store
    paths = RunPaths.of(workdir)
    paths.root.mkdir(parents=True)
    trackers = Trackers.open(cfg, paths)
    trackers.log({"step": 1, "loss": 5.0})
    trackers.finish()
    assert "MLflow" not in capfd.readouterr().err  # no warning: it logged where it was told
    saved = files.read_json(paths.tracking)["mlflow"]
    assert (tmp_path / store).exists() and store in saved["tracking_uri"]
    assert _mlflow_history(saved["tracking_uri"], saved["run_id"]) == {"loss": [(1, 5.0)]}


@pytest.mark.parametrize(
    "uri, said",
    [
        ("sqllite:///x.db", "is no MLflow tracking store; give http(s)://HOST:PORT, sqlite:///"),
        ("sqlite:/x.db", "is not a database URL"),
        ("sqlite://", "keeps nothing once the job ends"),
        ("http://:5000", "names no server"),
        ("file://otherhost/mlruns", "is a folder on host otherhost"),
        ("postgresql://db.internal/mlflow", "postgresql needs its driver"),
    ],
)
def test_an_mlflow_store_that_cannot_work_is_one_line_before_the_run(tmp_path, uri, said):
    from pipeline.tracking import settings

    cfg = make_config(tmp_path, "logging.mlflow.enabled=true", f"logging.mlflow.tracking_uri={uri}")
    with pytest.raises(ConfigError) as refused:
        settings.checked(cfg, tmp_path)
    message = str(refused.value)
    assert message.startswith("logging.mlflow.tracking_uri: ") and said in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "given, fix",
    [
        ("logging.mlflow.tracking_uri=http://mlflow.internal:5000", "logging.mlflow.enabled=true"),
        ("logging.mlflow.experiment=llm", "logging.mlflow.enabled=true"),
        ("logging.wandb.project=llm", "logging.wandb.mode=offline (or online)"),
        ("logging.wandb.tags=[a]", "logging.wandb.mode=offline (or online)"),
    ],
)
def test_a_tracker_setting_given_while_the_tracker_is_off_is_refused(tmp_path, given, fix):
    from pipeline.tracking import settings

    key = given.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: set, but .* is off; add "):
        settings.checked(make_config(tmp_path, given), tmp_path)
    with pytest.raises(ConfigError) as refused:
        settings.checked(make_config(tmp_path, given), tmp_path)
    assert str(refused.value).endswith(f"add {fix} to log there")


def test_a_tracker_holds_each_step_once_over_a_kill_and_a_resume(tmp_path):
    """A killed attempt logged steps 5 to 7 past its checkpoint at 4 (and wrote step 8 to
    metrics.jsonl, killed before its trackers had it); the resumed attempt does them again:
    each tracker keeps each step of each key once (the tokens of a step's validation
    included), as train/metrics.jsonl and TensorBoard do, and MLflow, which says what it
    holds, gets step 8 from the resumed attempt."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from pipeline.training.metrics import MetricsLog

    cfg = make_config(tmp_path, *TRACKED)
    paths = RunPaths.of(tmp_path)
    paths.train_dir.mkdir(parents=True)

    def attempt(resumed_at: int, last: int) -> None:
        log = MetricsLog(paths, True, cfg)
        log.keep_until(resumed_at)
        for step in range(resumed_at + 1, last + 1):
            log.record({"step": step, "tokens": 64 * step, "loss": 10.0 - step})
            if step % 2 == 0:  # a validation at the same step
                log.record({"step": step, "tokens": 64 * step, "val_loss": 11.0 - step})
        log.close()

    attempt(0, 7)  # killed at 7; its last checkpoint is step 4
    with paths.metrics.open("a") as f:  # step 8 written, killed before the trackers had it
        f.write(json.dumps({"step": 8, "tokens": 512, "loss": 2.0}) + "\n")
    attempt(4, 10)
    steps = list(range(1, 11))
    saved = files.read_json(paths.tracking)
    held = _mlflow_history(saved["mlflow"]["tracking_uri"], saved["mlflow"]["run_id"])
    # MLflow returns a metric's points in no set order (batches logged in one millisecond)
    assert sorted(s for s, _ in held["tokens"]) == steps
    assert sorted(s for s, _ in held["loss"]) == steps
    assert sorted(s for s, _ in held["val_loss"]) == [2, 4, 6, 8, 10]
    logged = [
        r["history"]["item"]
        for r in wandb_records(paths)
        if r["type"] == "history" and "tokens" in r["history"]["item"]
    ]
    # W&B cannot say what it holds: metrics.jsonl's records tell, the step it never had included
    assert sorted(item["step"] for item in logged) == [s for s in steps if s != 8]
