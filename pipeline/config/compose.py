"""From Hydra's composed config to the typed one the pipeline runs on, in one place.

    composed DictConfig -> PipelineConfig (OmegaConf.to_object) -> validate -> derived.resolve

The command line (pipeline.cli) does this once per command; `compose` does the same for tools
and tests that need a config without the command line; `read` loads a run's saved config.yaml.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pipeline.config import derived
from pipeline.config.schema import PipelineConfig
from pipeline.config.validate import validate

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "conf")


def register() -> None:
    """The schema as Hydra's `base_config`, which conf/config.yaml starts from, and the
    resolver that names a sweep point's folder."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=PipelineConfig)
    OmegaConf.register_new_resolver("sweep_point", sweep_point_folder, replace=True)


def sweep_point_folder(overrides: str) -> str:
    """A sweep point's folder name, from its overrides (Hydra's override_dirname): a point
    swept again with the same overrides finds its folder, one with others gets its own."""
    return "p" + hashlib.sha256(overrides.encode()).hexdigest()[:10]


def recompose(overrides: list[str]) -> DictConfig:
    """Compose again inside the running Hydra application (its config path, --config-dir
    included), with these overrides."""
    from hydra import compose as hydra_compose

    return hydra_compose(config_name="config", overrides=overrides)


def typed(composed: DictConfig) -> PipelineConfig:
    """The composed config as a PipelineConfig, interpolations resolved; not validated."""
    return OmegaConf.to_object(composed)


def load(
    composed: DictConfig,
    adjust: Callable[[PipelineConfig], PipelineConfig] | None = None,
) -> PipelineConfig:
    """Typed, `adjust`ed (a sweep point's own settings), validated, derived values filled in.
    Raises ConfigError naming the key."""
    cfg = typed(composed)
    if adjust is not None:
        cfg = adjust(cfg)
    validate(cfg)
    return derived.resolve(cfg)


def compose(workdir: str | Path, *overrides: str, check: bool = True) -> PipelineConfig:
    """The config the command line composes from conf/ for these overrides: validated and
    resolved, or with `check=False` only typed."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        composed = hydra_compose("config", overrides=[f"workdir={workdir}", *overrides])
    return load(composed) if check else typed(composed)


def to_yaml(cfg: PipelineConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def read(path: str | Path) -> PipelineConfig:
    """A config saved with `to_yaml` (a run's config.yaml), checked against the schema."""
    saved = OmegaConf.merge(OmegaConf.structured(PipelineConfig), OmegaConf.load(path))
    return typed(saved)
