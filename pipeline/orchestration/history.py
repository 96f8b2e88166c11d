"""The run's history, runs.jsonl: one record per launch that ran (a refused one writes nothing)
with the overrides the run's outputs are made with, what the command line gave, and what each
step did.

A rerun applies its command line on top of the run's overrides: a setting not given again keeps
the value the outputs were made with (an evaluation alone re-cuts no split with a default), and
a setting given again is a change, which each step judges (pipeline.orchestration.reruns).
What to run, and where and how (the keys the schema marks as commands: workdir, stages,
cluster, parallel, ...), is each command's own: the same outputs can be made, continued or evaluated
on other resources.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig, keys, renames
from pipeline.config.schema import DATA_SECTIONS
from pipeline.core import files
from pipeline.core.paths import RunPaths


def key_of(override: str) -> str:
    """The config key an override sets: train.steps=30, +eval.extra_sets.a=x, ~a.b, model=x."""
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def _top(key: str) -> str:
    return key.split(".", 1)[0].split("/", 1)[0]


def is_command(key: str) -> bool:
    """A key of what to run, where and how (its schema field says so), or Hydra's own."""
    group = key.split("/", 1)[0]  # cluster/site=x: a config group's option
    return _top(key) == "hydra" or keys.is_command(PipelineConfig, group)


def settings_overrides(overrides: list[str]) -> list[str]:
    """The overrides that set what the outputs are made of (not what to run, or where)."""
    return [o for o in overrides if not is_command(key_of(o))]


def recorded(paths: RunPaths) -> list[str]:
    """The overrides the run's outputs are made with: those of its last launch record, a key
    renamed since then under its new name."""
    if not paths.runs.exists():
        return []
    last = paths.runs.read_text().splitlines()[-1]
    return renames.overrides(list(json.loads(last)["overrides"]))


def data_overrides(prepared: str | Path | None) -> list[str]:
    """What the run holding the data (data.prepared) settled of data and tokenizer."""
    if not prepared:
        return []
    kept = recorded(RunPaths.of(prepared))
    return [o for o in kept if _top(key_of(o)) in DATA_SECTIONS and key_of(o) != "data.prepared"]


def combined(earlier: list[str], given: list[str]) -> list[str]:
    """`earlier` overrides, less those `given` sets again, then `given`. A group given again
    (model=gpt-350m) keeps the values set inside it before (model.hidden_size=1024), as
    replaying the earlier command lines would: give those again to change them. A deletion
    (~data.sources.code) keeps what it deletes before it (+data.sources.code={...})."""
    again = set_again(given)
    return [o for o in earlier if key_of(o) not in again and o not in given] + given


def set_again(given: list[str]) -> set[str]:
    """The keys `given` sets (a deletion sets nothing)."""
    return {key_of(o) for o in given if not o.startswith("~")}


def for_run(
    paths: RunPaths, prepared: str | None, given: list[str], base: RunPaths | None = None
) -> list[str]:
    """The overrides this run's outputs are made with once `given` applies: those the data's
    run settled, then those of the `base` run a sweep point starts from, then the run's own,
    then what `given` sets (command keys left out)."""
    inherited = recorded(base) if base is not None else []
    earlier = combined(combined(data_overrides(prepared), inherited), recorded(paths))
    return combined(earlier, settings_overrides(given))


def to_compose(
    paths: RunPaths, prepared: str | None, given: list[str], base: RunPaths | None = None
) -> list[str] | None:
    """The overrides to compose this command's config with: the run's (a sweep point's: its
    base run's first), then the command line's; None for a run with no history (the command
    line alone)."""
    inherited = recorded(base) if base is not None else []
    if not recorded(paths) and not data_overrides(prepared) and not inherited:
        return None
    return combined(for_run(paths, prepared, given, base), given)


def last_stages(paths: RunPaths) -> list[str] | None:
    """The stages the run's last launch ran."""
    if not paths.runs.exists():
        return None
    return json.loads(paths.runs.read_text().splitlines()[-1]).get("stages")


def append(paths: RunPaths, overrides: list[str], given: list[str], **what: Any) -> None:
    """A launch that is about to run: its record, last in runs.jsonl (written whole)."""
    record = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": sys.argv,
        "given": given,
        "overrides": overrides,
        **what,
    }
    earlier = paths.runs.read_text() if paths.runs.exists() else ""
    files.write_text(paths.runs, earlier + json.dumps(record) + "\n")
