"""What an output was made from, as build systems and DVC record it: the settings a step's
output depends on and the fingerprints of the outputs it read. Each step records this with
its completion marker ("made_from", and its "fingerprint"); a rerun compares it with what the
config asks for now and skips, continues, redoes or refuses (pipeline.orchestration.reruns).

    made_from = {"settings": {"tokenizer.vocab_size": 512, ...},   # dotted config keys
                 "inputs": {"tokenizer": "3f9c...", ...}}          # fingerprints of inputs

A key a record does not name (one added to the schema after the output was made) is compared
as its schema default: a new key whose default does what earlier versions did never makes an
old output look changed, while any other value of it does.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import types
from collections.abc import Mapping
from typing import Any

MadeFrom = dict[str, dict[str, Any]]


def made_from(settings: dict[str, Any], **inputs: str) -> MadeFrom:
    return {"settings": settings, "inputs": dict(inputs)}


def fingerprint(record: MadeFrom) -> str:
    """A short digest of what an output was made from: equal records, equal fingerprints."""
    text = json.dumps(record, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


ABSENT = "(absent)"


def defaults(schema: Any) -> Mapping[str, Any]:
    """The schema default of each dotted key of a dataclass config (a class or an instance of
    it): each field's default, section by section (a field made by a dataclass is a section).
    Nothing for a config of another kind."""
    kind = schema if isinstance(schema, type) else type(schema)
    return _defaults(kind) if dataclasses.is_dataclass(kind) else {}


@functools.cache
def _defaults(schema: type) -> Mapping[str, Any]:
    found: dict[str, Any] = {}
    for field in dataclasses.fields(schema):
        make = field.default_factory
        if dataclasses.is_dataclass(make):
            found.update({f"{field.name}.{k}": v for k, v in _defaults(make).items()})
        elif field.default is not dataclasses.MISSING:
            default = field.default
            found[field.name] = default.value if isinstance(default, enum.Enum) else default
        elif make is not dataclasses.MISSING:
            found[field.name] = make()
    return types.MappingProxyType(found)


def differences(
    recorded: MadeFrom, now: MadeFrom, default: Mapping[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """(key, recorded value, value now) for each setting or input that differs; an input is
    named by its step ("input tokenizer"). A setting that is a mapping (data.sources) is
    compared entry by entry, so the key names what changed (data.sources.prose.text_key). A
    setting the record does not name is compared as its `default` (`defaults(cfg)`), if any."""
    found = []
    for part, label in (("settings", ""), ("inputs", "input ")):
        old, new = recorded.get(part, {}), now.get(part, {})
        given = default if part == "settings" and default is not None else {}
        for key in sorted(set(old) | set(new)):
            was = old.get(key, given.get(key, ABSENT))
            found.extend(_leaves(f"{label}{key}", was, new.get(key, ABSENT)))
    return found


def same(recorded: MadeFrom, now: MadeFrom, default: Mapping[str, Any] | None = None) -> bool:
    """The record says the output was made from what `now` asks for (keys it does not name
    taken as their `default`)."""
    return recorded == now or not differences(recorded, now, default)


def _leaves(key: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict) and old and new:
        return [
            leaf
            for name in sorted(set(old) | set(new), key=str)
            for leaf in _leaves(f"{key}.{name}", old.get(name, ABSENT), new.get(name, ABSENT))
        ]
    return [(key, old, new)]


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(found: list[tuple[str, Any, Any]], most: int = 4) -> str:
    """'train.lr=0.003 (now 0.001), model.hidden_size=64 (now 128)' for a one-line message."""
    parts = [f"{key}={_short(old)} (now {_short(new)})" for key, old, new in found[:most]]
    if len(found) > most:
        parts.append(f"and {len(found) - most} more")
    return ", ".join(parts)
