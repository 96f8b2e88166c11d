"""Keys that have a new name: the old name keeps working wherever a user or a run folder may
still give it, one warning line naming the new key where a user gave it.

    on the command line (sweeps too)   pipeline.cli renames the overrides before Hydra sees them
    in a user's YAML (conf/cluster/SITE.yaml)   composed into the old key, which `accepting`
                                       adds to the schema Hydra composes with; `moved` puts
                                       the value under the new key
    in a run folder of an earlier version   its config.yaml (`mapping`) and the overrides its
                                       runs.jsonl recorded (`override`), renamed as read
    a sweep point an earlier version made   found by its folder's name (`earlier_dirname`)

Completion markers record only settings (Role.OUTPUT and CONTINUE keys); a renamed key is
Role.NOT_SETTING (tests/unit/test_config_renames.py holds that), so no marker names one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.core import log
from pipeline.core.errors import ConfigError

# old dotted key -> new dotted key
RENAMED = {
    "cluster.hang_timeout_s": "resilience.hang_timeout_s",
    "cluster.straggler_threshold": "resilience.straggler_threshold",
    "cluster.max_restarts": "resilience.max_restarts",
    "cluster.spare_nodes": "resilience.spare_nodes",
    "train.max_requeues": "resilience.max_requeues",
    "train.exit_signal_lead_s": "resilience.exit_signal_lead_s",
    "train.max_failed_saves": "resilience.max_failed_saves",
}

Warn = Callable[[str], None]


def warning(old: str) -> str:
    return f"warning: {old} is now {RENAMED[old]}; the old name still works, give the new one"


_warned: set[str] = set()


def warn_once(line: str) -> None:
    """Log a warning line once per process, however often the config is composed."""
    if line not in _warned:
        _warned.add(line)
        log.get().warning(line)


def override(arg: str, warn: Warn | None = None) -> str:
    """One override (KEY=VALUE, +KEY=..., ~KEY) with its key's new name, if it has one."""
    prefix = arg[: len(arg) - len(arg.lstrip("+~"))]
    name, sep, value = arg[len(prefix) :].partition("=")
    if name not in RENAMED:
        return arg
    if warn is not None:
        warn(warning(name))
    return f"{prefix}{RENAMED[name]}{sep}{value}"


def overrides(args: list[str], warn: Warn | None = None) -> list[str]:
    return [override(arg, warn) for arg in args]


def earlier_dirname(dirname: str) -> str:
    """Hydra's override_dirname (the sorted overrides, joined by commas) as an earlier version
    made it for the same command line: each renamed key under its old name."""
    old_of = {new: old for old, new in RENAMED.items()}
    items = re.split(r",(?=[+~]*[A-Za-z_][\w./@-]*=)", dirname)
    earlier = []
    for item in items:
        prefix = item[: len(item) - len(item.lstrip("+~"))]
        name, sep, value = item[len(prefix) :].partition("=")
        earlier.append(f"{prefix}{old_of.get(name, name)}{sep}{value}")
    return ",".join(sorted(earlier))


def mapping(data: dict[str, Any]) -> dict[str, Any]:
    """A config read from a file (a run's config.yaml) with each old key under its new name;
    a value given under both names keeps the new name's."""
    result = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for old, new in RENAMED.items():
        (old_section, old_leaf), (new_section, new_leaf) = old.split("."), new.split(".")
        section = result.get(old_section)
        if not isinstance(section, dict) or old_leaf not in section:
            continue
        value = section.pop(old_leaf)
        result.setdefault(new_section, {}).setdefault(new_leaf, value)
    return result


def accepting(schema: type) -> type:
    """`schema` with each old key as a field too (any value, None by default), so that a YAML
    file that sets it composes; `moved` then puts its value under the new key."""
    extra: dict[str, list[tuple[str, Any, Any]]] = {}
    for old in RENAMED:
        section, leaf = old.split(".")
        extra.setdefault(section, []).append((leaf, Any, dataclasses.field(default=None)))
    hints = {f.name: f.default_factory for f in dataclasses.fields(schema)}
    sections = []
    for section, fields in extra.items():
        base = hints[section]
        wider = dataclasses.make_dataclass(base.__name__, fields, bases=(base,))
        sections.append((section, wider, dataclasses.field(default_factory=wider)))
    return dataclasses.make_dataclass(schema.__name__, sections, bases=(schema,))


def moved(composed: DictConfig, schema: type, warn: Warn) -> DictConfig:
    """The composed config as `schema` has it: each value set under an old key (by a YAML
    file) under its new name instead, with a warning; the old keys' None defaults left out."""
    data = OmegaConf.to_container(composed, resolve=False)
    for old, new in RENAMED.items():
        (section, leaf), (new_section, new_leaf) = old.split("."), new.split(".")
        value = data.get(section, {}).pop(leaf, None)
        if value is not None:
            warn(warning(old))
            data[new_section][new_leaf] = value
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), data)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from e
