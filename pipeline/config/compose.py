"""From Hydra's composed config to the typed one the pipeline runs on, in one place.

    composed DictConfig -> PipelineConfig (OmegaConf.to_object) -> checks -> derived.resolve

The command line (pipeline.cli) does this once per command; `compose` does the same for tools
and tests that need a config without the command line; `read` loads a run's saved config.yaml.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config import checks, derived, renames
from pipeline.config.schema import PipelineConfig, SourceConfig
from pipeline.config.split_weights import Split
from pipeline.core.errors import ConfigError

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "conf")


def register() -> None:
    """The schema as Hydra's `base_config`, which conf/config.yaml starts from, and the
    resolver that names a sweep point's folder."""
    from hydra.core.config_store import ConfigStore

    # with the renamed keys' old names, which a user's YAML may still set (renames.moved)
    ConfigStore.instance().store(name="base_config", node=renames.accepting(PipelineConfig))
    OmegaConf.register_new_resolver("sweep_point", sweep_point_folder, replace=True)


def sweep_point_folder(overrides: str, sweep_dir: str = "") -> str:
    """A sweep point's folder name, from its overrides (Hydra's override_dirname): a point
    swept again with the same overrides finds its folder, one with others gets its own. A point
    an earlier version made, named by the old name of a renamed key, keeps its folder."""
    name = _point_name(overrides)
    earlier = _point_name(renames.earlier_dirname(overrides))
    folder = Path(sweep_dir) if sweep_dir else None
    if folder and earlier != name and (folder / earlier).is_dir() and not (folder / name).exists():
        return earlier
    return name


def _point_name(overrides: str) -> str:
    return "p" + hashlib.sha256(overrides.encode()).hexdigest()[:10]


def recompose(overrides: list[str]) -> DictConfig:
    """Compose again inside the running Hydra application (its config path, --config-dir
    included), with these overrides."""
    from hydra import compose as hydra_compose

    return hydra_compose(config_name="config", overrides=overrides)


def typed(composed: DictConfig) -> PipelineConfig:
    """The composed config as a PipelineConfig, interpolations resolved, data.sources as
    SourceConfig; not checked. A value left ??? is a ConfigError (OmegaConf would fill a
    list's default in silently). A renamed key a YAML file set under its old name is moved to
    its new one, with a warning."""
    _refuse_unknown_keys(composed, PipelineConfig, "")
    composed = renames.moved(composed, PipelineConfig, renames.warn_once)
    missing = sorted(OmegaConf.missing_keys(composed))
    if missing:
        raise ConfigError(f"{missing[0]}: needs a value (it is ??? in the config)")
    cfg = OmegaConf.to_object(composed)
    cfg.data.split = Split.of(cfg.data.split)  # parsed once, here
    cfg.data.sources = {name: source(name, value) for name, value in cfg.data.sources.items()}
    return cfg


def _refuse_unknown_keys(node: DictConfig, schema: type, prefix: str) -> None:
    """A key the schema does not have (`+train.stepz=20`, a typo Hydra lets through when
    asked to add it) is a ConfigError naming it and the nearest real key, never a new
    setting that nothing reads. A renamed key's old name is let through (renames.moved), and
    suggests its new name."""
    hints = typing.get_type_hints(schema)
    # the old names of keys of this section: key -> its new dotted name
    old = {
        k.removeprefix(prefix): new
        for k, new in renames.RENAMED.items()
        if k.startswith(prefix) and "." not in k.removeprefix(prefix)
    }
    for key in node:
        name = f"{prefix}{key}"
        if name in renames.RENAMED:
            continue
        if key not in hints:
            near = difflib.get_close_matches(str(key), [*hints, *old], n=1)
            hint = f"; did you mean {old.get(near[0], prefix + near[0])}?" if near else ""
            raise ConfigError(f"{name}: not a setting of this pipeline{hint}")
        child = node._get_node(key)
        if dataclasses.is_dataclass(hints[key]) and isinstance(child, DictConfig):
            _refuse_unknown_keys(child, hints[key], f"{name}.")


def source(name: str, value: Any) -> SourceConfig:
    """One entry of data.sources as a SourceConfig, every key and type checked: the schema
    leaves the entries untyped, as OmegaConf cannot add typed ones from the command line
    (+data.sources.NAME={...})."""
    key = f"data.sources.{name}"
    if isinstance(value, SourceConfig):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: give {{inputs: [GLOB, ...], weight: W}}, not {value!r}")
    known = [f.name for f in dataclasses.fields(SourceConfig)]
    for unknown in sorted(set(value) - set(known)):
        raise ConfigError(f"{key}.{unknown}: not a setting of a source ({', '.join(known)})")
    inputs = value.get("inputs", [])
    inputs = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(inputs, list) or not all(isinstance(p, str) for p in inputs):
        raise ConfigError(f"{key}.inputs: give a list of globs, not {inputs!r}")
    weight = value.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise ConfigError(f"{key}.weight: give a number, not {weight!r}")
    text_key = value.get("text_key")
    if text_key is not None and not isinstance(text_key, str):
        raise ConfigError(f"{key}.text_key: give a string, not {text_key!r}")
    for optional in ("format", "where"):
        if value.get(optional) is not None and not isinstance(value[optional], str):
            raise ConfigError(f"{key}.{optional}: give a string, not {value[optional]!r}")
    return SourceConfig(
        list(inputs), text_key, float(weight), value.get("format"), value.get("where")
    )


Adjust = Callable[[PipelineConfig], PipelineConfig]


def load(
    composed: DictConfig, adjust: Adjust | None = None, settle: Adjust | None = None
) -> PipelineConfig:
    """Typed, `adjust`ed (a sweep point's own settings), checked, `settle`d (the planner's
    choice for the values left to it, train.micro_batch_size=auto and train.recompute=auto),
    derived values filled in. Raises ConfigError naming the key."""
    cfg = typed(composed)
    if adjust is not None:
        cfg = adjust(cfg)
    checks.check(cfg)
    if settle is not None:
        settled = settle(cfg)
        if settled is not cfg:  # the values it chose, checked as given ones are
            checks.check(settled)
        cfg = settled
    return derived.resolve(cfg)


def compose(
    workdir: str | Path, *overrides: str, check: bool = True, settle: Adjust | None = None
) -> PipelineConfig:
    """The config the command line composes from conf/ for these overrides: checked and
    resolved (the command line settles auto values with pipeline.planning.auto.settle), or
    with `check=False` only typed."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        try:
            composed = hydra_compose("config", overrides=[f"workdir={workdir}", *overrides])
        except (HydraException, OmegaConfBaseException) as e:
            choice = not_a_choice(f"{e}\n{e.__cause__}")
            if choice is None:
                raise
            raise ConfigError(choice) from e
    return load(composed, settle=settle) if check else typed(composed)


def not_a_choice(message: str) -> str | None:
    """OmegaConf's refusal of a value that is none of a key's choices, in one line as
    pipeline.config.checks words it; None for any other message."""
    invalid = re.search(r"Invalid value '(.*)', expected one of \[(.*)\]", message)
    key = re.search(r"full_key: (\S+)", message)
    return f"{key[1]}: {invalid[1]!r} is not one of {invalid[2]}" if invalid and key else None


def to_yaml(cfg: PipelineConfig) -> str:
    data = dataclasses.replace(cfg.data, split=str(cfg.data.split))  # as the text it is
    return OmegaConf.to_yaml(OmegaConf.structured(dataclasses.replace(cfg, data=data)))


def read(path: str | Path) -> PipelineConfig:
    """A config saved with `to_yaml` (a run's config.yaml), checked against the schema."""
    loaded = renames.mapping(OmegaConf.to_container(OmegaConf.load(path)))  # of an earlier version
    saved = OmegaConf.merge(OmegaConf.structured(PipelineConfig), loaded)
    return typed(saved)
