"""logging.mlflow.enabled: an MLflow run per run folder, continued by the run id tracking.json
keeps. With no logging.mlflow.tracking_uri, or a server that does not answer, a file store in
the run folder (a sweep's points: in the sweep folder), read with `mlflow ui
--backend-store-uri`."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.paths import RunPaths
from pipeline.tracking import identity, mlflow_uri

_log = log.get()
MAX_PARAM = 6000  # MLflow's longest parameter value


def local_store(paths: RunPaths) -> Path:
    return (identity.sweep_folder(paths) or paths.root) / "mlruns"


def answers(uri: str, timeout: float = 5.0) -> bool:
    """Whether a server's port accepts a connection (MLflow's client would retry for minutes)."""
    url = urlparse(uri)
    if url.scheme not in ("http", "https"):
        return True
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


class MlflowTracker:
    name = "MLflow"

    def __init__(self, client: Any, run_id: str, continued: bool) -> None:
        self.client, self.run_id = client, run_id
        self.continued = continued  # an earlier job's run, which holds what that job logged
        self.pending: list[Any] = []  # asynchronous batches, waited for at the end

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items()]
        self.pending.append(self.client.log_batch(self.run_id, metrics=metrics, synchronous=False))

    def results(self, values: dict[str, float], step: int) -> None:
        self.log(values, step)

    def holds(self, keys: set[str]) -> dict[str, int]:
        """The last step of each of `keys` this run holds: what a killed job logged, less the
        batches it still had queued at the kill, which never arrived."""
        held = {}
        for key in keys:
            steps = [m.step for m in self.client.get_metric_history(self.run_id, key)]
            if steps:
                held[key] = max(steps)
        return held

    def identify(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def upload(self, found: list[Path]) -> None:
        root = Path(os.path.commonpath([p.parent for p in found]))
        for path in found:
            folder = str(path.parent.relative_to(root))
            self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder)

    def close(self) -> None:
        for operation in self.pending:
            operation.wait()
        self.pending = []
        self.client.set_terminated(self.run_id)


def _experiment(client: Any, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:  # another sweep point created it meanwhile
        return client.get_experiment_by_name(name).experiment_id


def _params(client: Any, run_id: str, cfg: PipelineConfig) -> None:
    """The config as parameters; a value changed since (more train.steps) as a tag, as MLflow
    keeps a parameter's first value."""
    from mlflow.entities import Param, RunTag

    logged = client.get_run(run_id).data.params
    params, changed = [], []
    for k, v in identity.flat_config(cfg).items():
        value = str(v)[:MAX_PARAM]
        if k not in logged:
            params.append(Param(k, value))
        elif logged[k] != value:
            changed.append(RunTag(f"config.{k}", value))
    client.log_batch(run_id, params=params, tags=changed)


def start(cfg: PipelineConfig, paths: RunPaths, saved: dict | None) -> tuple[MlflowTracker, dict]:
    from mlflow.entities import RunStatus, RunTag
    from mlflow.tracking import MlflowClient

    m = cfg.logging.mlflow
    uri = m.tracking_uri
    if uri and not answers(uri):
        _log.warning(
            f"logging.mlflow.tracking_uri: {urlparse(uri).hostname} does not answer; logging to "
            f"{local_store(paths)} (mlflow ui --backend-store-uri {local_store(paths)})"
        )
        uri = None
    uri = mlflow_uri.absolute(uri, Path.cwd()) if uri else local_store(paths).as_uri()
    for chatty in ("mlflow.store.db", "alembic"):  # a SQLite store's set-up, at each job start
        logging.getLogger(chatty).setLevel(logging.WARNING)
    if mlflow_uri.is_file_store(uri):
        # MLflow keeps its file store, in maintenance: one folder per run, safe for the points
        # of a sweep writing at once, and no database on a shared filesystem
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    run_id = (saved or {}).get("run_id") if (saved or {}).get("tracking_uri") == uri else None
    continued = run_id is not None
    if run_id is None:
        run_id = client.create_run(_experiment(client, m.experiment), run_name=paths.root.name)
        run_id = run_id.info.run_id
    else:
        client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
    tags = identity.identity(paths)
    group = identity.sweep_group(paths)
    if group:
        tags["sweep"] = group
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    _params(client, run_id, cfg)
    return MlflowTracker(client, run_id, continued), {"tracking_uri": uri, "run_id": run_id}
