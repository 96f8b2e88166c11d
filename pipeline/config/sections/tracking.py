"""Experiment trackers (logging.*): W&B and MLflow, each optional."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config import choices as c
from pipeline.config.keys import NOT_SETTING, key


@dataclass
class WandbConfig:
    """Weights & Biases: the logging rank's metrics, the config and the results."""

    # offline: compute nodes without internet; `wandb sync` from the login node uploads it
    mode: c.WandbMode = key(
        c.WandbMode.disabled,
        NOT_SETTING,
        "log to W&B; offline: files in the run folder",
        common=True,
    )
    project: str = key("pipeline", NOT_SETTING, "the W&B project")
    entity: str | None = key(None, NOT_SETTING, "the W&B team or user; none: the account's own")
    group: str | None = key(None, NOT_SETTING, "runs shown together; none: a sweep's points")
    tags: list[str] = key(role=NOT_SETTING, help="the W&B run's tags", factory=list)


@dataclass
class MlflowConfig:
    """MLflow: what W&B receives, to an MLflow tracking store."""

    enabled: bool = key(False, NOT_SETTING, "log the run to MLflow", common=True)
    # a server (http://host:5000) or a store; none: a file store in the run folder (a sweep's
    # points: in the sweep folder), read with `mlflow ui --backend-store-uri PATH`
    tracking_uri: str | None = key(None, NOT_SETTING, "an MLflow server; none: WORKDIR/mlruns")
    experiment: str = key("pipeline", NOT_SETTING, "the MLflow experiment")


@dataclass
class LoggingConfig:
    """Experiment trackers, each optional: one that is off is never imported."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
