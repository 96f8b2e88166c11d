"""The logging.* keys, judged by the launcher before anything runs: a tracker's setting given
while the tracker is off is a mistake (the run would not log where it says), and an MLflow
store it cannot log to is one line, never a warning once the run has started."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.config.choices import WandbMode
from pipeline.core.errors import ConfigError
from pipeline.tracking import mlflow_uri

# each tracker's switch, and what turns it on
SWITCHES = {
    "wandb": ("W&B", "mode", "logging.wandb.mode=offline (or online)"),
    "mlflow": ("MLflow", "enabled", "logging.mlflow.enabled=true"),
}


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _set_while_off(section: Any, name: str) -> str | None:
    """The first key of a tracker's section given a value while the tracker is off."""
    shown, switch, turn_on = SWITCHES[name]
    if getattr(section, switch) not in (False, WandbMode.disabled):
        return None
    for field in dataclasses.fields(section):
        if field.name != switch and getattr(section, field.name) != _default(field):
            key = f"logging.{name}.{field.name}"
            return f"{key}: set, but {shown} is off; add {turn_on} to log there"
    return None


def checked(cfg: PipelineConfig, launched_from: Path) -> PipelineConfig:
    """`cfg`, its MLflow store's local path made absolute (every job logs to one store);
    raises ConfigError for a tracker setting that cannot take effect."""
    for name in SWITCHES:
        problem = _set_while_off(getattr(cfg.logging, name), name)
        if problem:
            raise ConfigError(problem)
    mlflow = cfg.logging.mlflow
    if not mlflow.enabled or mlflow.tracking_uri is None:
        return cfg
    problem = mlflow_uri.problem(mlflow.tracking_uri)
    if problem:
        raise ConfigError(problem)
    uri = mlflow_uri.absolute(mlflow.tracking_uri, launched_from)
    logging = dataclasses.replace(cfg.logging, mlflow=dataclasses.replace(mlflow, tracking_uri=uri))
    return dataclasses.replace(cfg, logging=logging)
