"""What a key's value must be beyond its type, stated once on its schema field (`rule=`) and
read from there: pipeline.config.checks refuses a value that breaks it, in one line that starts
with the key, before anything is written or submitted; `--help` shows it with the key's help.

    steps: int = key(1000, CONTINUE, "training steps", rule=AT_LEAST_ONE)

None, where the type allows it, is "not given" and passes every rule. What holds between
keys (batch arithmetic, divisibility, what the stages need) is checked in
pipeline.config.checks.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import row_filter, slurm_time
from pipeline.config.split_weights import Split

# (key, value) -> the one-line refusal, starting with the key (or one of its entries); None: ok
Refusal = Callable[[str, Any], "str | None"]


@dataclass(frozen=True)
class Rule:
    says: str  # what a value must be, as --help shows it: "must be at least 1"
    refusal: Refusal

    def refuse(self, key: str, value: Any) -> str | None:
        return None if value is None else self.refusal(key, value)


def bound(says: str, holds: Callable[[Any], bool]) -> Rule:
    """A rule refused as the value, then what it must be: `train.steps: 0 must be at least 1`."""
    return Rule(says, lambda key, value: None if holds(value) else f"{key}: {value!r} {says}")


def at_least(least: int) -> Rule:
    return bound(f"must be at least {least}", lambda v: v >= least)


AT_LEAST_ONE = at_least(1)
NOT_NEGATIVE = bound("must not be negative", lambda v: v >= 0)
POSITIVE = bound("must be a positive number", lambda v: v > 0 and math.isfinite(v))
FRACTION = bound("must be in [0, 1)", lambda v: 0 <= v < 1)
SHARE = bound("must be in [0, 1]", lambda v: 0 <= v <= 1)
PROBABILITY = bound("must be in (0, 1]", lambda v: 0 < v <= 1)
NOT_EMPTY = bound("must not be empty", lambda v: len(v) > 0)


def whole_or(word: str) -> Rule:
    """A whole number of at least 1, or `word` (auto: the planner chooses)."""

    def refusal(key: str, value: Any) -> str | None:
        if value == word or (type(value) is int and value >= 1):
            return None
        if type(value) is int:
            return f"{key}: {value} is not >= 1 or {word}"
        return f"{key}: {value!r} is not a whole number or {word}"

    return Rule(f"must be a whole number >= 1, or {word}", refusal)


def in_order(allowed: Sequence[str]) -> Rule:
    """A list of some of `allowed`, each once, in their order."""
    names = ", ".join(allowed)

    def refusal(key: str, value: list[str]) -> str | None:
        for item in value:
            if item not in allowed:
                return f"{key}: {item!r} is not one of {names}"
        if list(value) != [a for a in allowed if a in value]:
            return f"{key}: must be in pipeline order ({names})"
        return None

    return Rule(f"must be some of {names}, in that order", refusal)


def _path_is(exists: Callable[[str], bool], what: str) -> Rule:
    """An existing path ('' passes, as None does: not given)."""

    def refusal(key: str, path: str) -> str | None:
        return None if not path or exists(path) else f"{key}: {path} is not a {what}"

    return Rule(f"must be a {what}", refusal)


A_FILE = _path_is(os.path.isfile, "file")
A_FOLDER = _path_is(os.path.isdir, "folder")


def _folder_to_write(key: str, path: str) -> str | None:
    if not path:
        return f"{key}: must be a path"
    folder = Path(os.path.expanduser(path)).absolute()
    for existing in (folder, *folder.parents):
        if existing.exists():
            if existing.is_dir():
                return None
            what = path if existing == folder else f"{path}: {existing}, in its path,"
            return f"{key}: {what} is a file, not a folder"
    return None


# A folder the pipeline makes and writes into: neither a file nor under one
FOLDER_TO_WRITE = Rule(
    "must be a folder or a path to make one, with no file on the way", _folder_to_write
)


def _prepared(key: str, folder: str) -> str | None:
    if not folder:
        return None
    manifest = os.path.join(os.path.expanduser(folder), "data", "manifest.json")
    return None if os.path.isfile(manifest) else f"{key}: {manifest} does not exist"


PREPARED_RUN = Rule("must be a run folder with tokenized data: DIR/data/manifest.json", _prepared)


def _slurm_time(key: str, limit: str) -> str | None:
    found = slurm_time.minutes(limit)
    if found is None:
        return f"{key}: {limit!r} is not a Slurm time ([days-]hh:mm:ss)"
    return None if found > 0 else f"{key}: {limit!r} is 0 minutes"


SLURM_TIME = Rule("must be a Slurm time above 0: [days-]hh:mm:ss or minutes", _slurm_time)


def _row_filter(key: str, where: str) -> str | None:
    try:
        row_filter.parse(where)
    except row_filter.BadFilter as e:
        return (
            f"{key}: {where!r}: {e}; give comparisons of a column with a number or "
            "'string' (==, !=, <, <=, >, >=) joined by and/or"
        )
    return None


ROW_FILTER = Rule(
    "must be comparisons of a column with a number or 'string', joined by and/or", _row_filter
)
SOURCE_FORMAT = bound("must be auto or text", lambda v: v in ("auto", "text"))


def _split(key: str, value: Any) -> str | None:
    if Split.of(value).weights[0] > 0:  # a split that does not parse names data.split itself
        return None
    return f"{key}: the training weight must be positive"


SPLIT = Rule("must be train,validation,test weights >= 0, the training one positive", _split)


def _sources(key: str, sources: dict[str, Any]) -> str | None:
    for name in sources:
        if re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", name) is None:
            return (
                f"{key}.{name}: name a source with lower-case letters, digits, _ and - "
                "(it names files and metrics)"
            )
    return None


SOURCE_NAMES = Rule("each named with lower-case letters, digits, _ and -", _sources)


def _extra_sets(key: str, sets: dict[str, Any]) -> str | None:
    for name in sets:
        if re.fullmatch(r"[\w.-]+", name) is None:
            return f"{key}.{name}: name a set with [A-Za-z0-9_.-]"
        if name.startswith("test"):
            return f"{key}.{name}: 'test...' names the held-out split's sets"
    return None


EXTRA_SET_NAMES = Rule("each set named with [A-Za-z0-9_.-], not test...", _extra_sets)


def _folders(key: str, paths: list[str]) -> str | None:
    missing = [p for p in paths if not os.path.isdir(os.path.expanduser(str(p)))]
    return f"{key}: {missing[0]!r} is not a folder" if missing else None


FOLDERS = Rule("existing folders", _folders)


def _task_metric(key: str, value: str) -> str | None:
    task, _, metric = value.partition("/")
    if task.strip() and metric.strip() and "/" not in metric and " " not in value:
        return None
    return f"{key}: {value!r} is not TASK/METRIC (hellaswag/acc_norm, say)"


TASK_METRIC = Rule("TASK/METRIC", _task_metric)

_SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)


def _sbatch_options(key: str, options: dict[str, Any]) -> str | None:
    for name, value in options.items():
        if not _SBATCH_OPTION.fullmatch(str(name)):
            return f"{key}: {str(name)!r} is not an sbatch option name"
        if not isinstance(value, (str, int, float)) or value is False:
            return f"{key}.{name}: {value!r} must be a string, a number or true (a flag)"
    return None


SBATCH_OPTIONS = Rule("option names, each a string, a number or true (a flag)", _sbatch_options)


def _environment(key: str, env: dict[str, Any]) -> str | None:
    for name in env:
        if not _ENV_NAME.fullmatch(str(name)):
            return f"{key}: {str(name)!r} is not an environment variable name"
        # config.yaml, the job scripts and the trackers would hold it; jobs inherit the
        # environment of the command that submits them
        if _SECRET_NAME.search(str(name)):
            return f"{key}.{name}: a secret? export it in the shell instead"
    return None


ENVIRONMENT = Rule("variable names, none of a secret (KEY, TOKEN, PASSWORD...)", _environment)


def _mounts(key: str, mounts: list[str]) -> str | None:
    for mount in mounts:
        if ":" not in mount or "," in mount:
            return f"{key}: {mount!r} is not SRC:DST[:FLAGS] (one mount per list item)"
    return None


MOUNTS = Rule("each SRC:DST[:FLAGS]", _mounts)
