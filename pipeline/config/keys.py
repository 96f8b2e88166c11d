"""What each config key is, stated once on its schema field (pipeline.config.sections) and
read from there by whatever needs it: the checks (choices, rules, values that go into job
scripts), provenance (which keys an output is made from, which ones let a training go on),
the run's history (what is a command's own and what a setting) and `--help`.

    steps: int = key(1000, Role.CONTINUE, "training iterations", rule=AT_LEAST_ONE)

A rule (pipeline.config.rules) is what a value must be beyond its type.

A choice is a `Choice` enum as the field's type: OmegaConf refuses any other value as it
composes, and its members compare, hash and print as their strings.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.config.rules import Rule


class Role(enum.Enum):
    """What a changed value does to the outputs a run already made."""

    # What an output is made from: changed, the output is redone, or refused where redoing
    # it would lose work (a training)
    OUTPUT = "output"
    # Decides what comes next, not what was made: changed, a training goes on from where it is
    CONTINUE = "continue"
    # How, where or how fast, never what: changed, every output stays valid
    NOT_SETTING = "not a setting"


OUTPUT, CONTINUE, NOT_SETTING = Role.OUTPUT, Role.CONTINUE, Role.NOT_SETTING


class Choice(str, enum.Enum):
    """A key's allowed values; each member's name is its value. Members are strings: they
    equal, hash, format and print as their value, in JSON, YAML and messages alike."""

    __str__ = str.__str__
    __format__ = str.__format__

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


@dataclass(frozen=True)
class Key:
    """A leaf key's story (the metadata of its schema field)."""

    role: Role
    help: str
    rule: Rule | None = None  # what a value must be beyond its type
    command: bool = False  # what to run, where and how: each command line's own, not recorded
    script: bool = False  # written into job scripts: no control characters
    common: bool = False  # listed by --help


def key(
    default: Any = dataclasses.MISSING,
    role: Role | None = None,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    rule: Rule | None = None,
    command: bool = False,
    script: bool = False,
    common: bool = False,
) -> Any:
    """A schema field with its key's metadata: the default (or a `factory` for a list or a
    dict), its role, a one-line help, and what else applies. A key without a role is refused
    as the schema is defined: no default could be right for all keys."""
    if role is None:
        raise TypeError("key(): give the key's role (Role.OUTPUT, CONTINUE or NOT_SETTING)")
    meta = {"key": Key(role, help, rule, command, script, common)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def command(default: Any = None, help: str = "", **rest: Any) -> Any:
    """A key of what to run, where and how: never a setting of an output."""
    return key(default, Role.NOT_SETTING, help, command=True, **rest)


@dataclass(frozen=True)
class Leaf:
    name: str  # dotted: "train.steps"
    info: Key | None  # None: a field declared without key()
    type: Any

    @property
    def choices(self) -> tuple[str, ...] | None:
        kind = self.type
        return kind.values() if isinstance(kind, type) and issubclass(kind, Choice) else None


@functools.cache
def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


@functools.cache
def _leaves(cls: type, prefix: str) -> tuple[Leaf, ...]:
    found: list[Leaf] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            found.extend(_leaves(hint, f"{prefix}{f.name}."))
        else:
            found.append(Leaf(f"{prefix}{f.name}", f.metadata.get("key"), hint))
    return tuple(found)


def leaves(schema: Any) -> tuple[Leaf, ...]:
    """Every leaf key of a schema class or instance (its own class's fields), depth first; a
    field whose type is a dataclass is a section."""
    return _leaves(schema if isinstance(schema, type) else type(schema), "")


def leaf(schema: Any, name: str) -> Leaf | None:
    """The leaf key `name` of `schema`, or the one a key under it belongs to (a dict's entry:
    cluster.env.NCCL_DEBUG); None when there is none."""
    for found in leaves(schema):
        if name == found.name or name.startswith(found.name + "."):
            return found
    return None


def value_at(cfg: Any, name: str) -> Any:
    """The value of a dotted key, e.g. "train.lr"."""
    for part in name.split("."):
        cfg = getattr(cfg, part)
    return cfg


def plain(value: Any) -> Any:
    """A Choice as its string; anything else as it is."""
    return value.value if isinstance(value, Choice) else value


def settings(section: Any, prefix: str, apart: tuple[str, ...] = ()) -> dict[str, Any]:
    """What an output made from a config section depends on: its keys that are settings (not
    Role.NOT_SETTING) as dotted keys, e.g. {"model.hidden_size": 128, ...}; `apart`: names a
    step records in a form of its own."""
    return {
        f"{prefix}.{found.name}": plain(value_at(section, found.name))
        for found in leaves(section)
        if found.info is not None
        and found.info.role is not Role.NOT_SETTING
        and found.name not in apart
    }


def with_role(schema: Any, role: Role) -> set[str]:
    return {f.name for f in leaves(schema) if f.info is not None and f.info.role is role}


def is_command(schema: Any, name: str) -> bool:
    """A key of what to run, where and how (`name` may be a section, or a dict's entry)."""
    found = leaf(schema, name)
    if found is not None:
        return found.info is not None and found.info.command
    under = [f for f in leaves(schema) if f.name.startswith(name + ".")]
    return bool(under) and all(f.info is not None and f.info.command for f in under)
