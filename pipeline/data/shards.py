"""The shard plan: which bytes of which input files each tokenize task reads.

Deterministic for a given file list and shard count: the files in corpus order
(pipeline.data.sources) are laid end to end and cut into equal byte ranges (gzip files cannot be
cut and go whole to one shard). The plan is written once into the run, so a rerun reads exactly
what the first run planned. Which split a document goes to does not depend on the plan
(pipeline.data.splits).
"""

from __future__ import annotations

import bisect
import os

from pipeline.config import DataConfig
from pipeline.core import files, log
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import sources
from pipeline.data.records import Span, is_gzip, misnamed
from pipeline.data.sources import portable

_log = log.get("plan")

FORMAT = 2  # of the data folder: 2, every document's split decided by its text (0.3 on)


def make_plan(files_and_sizes: list[tuple[str, str, int]], num_shards: int) -> list[list[Span]]:
    """Cut the concatenated inputs, (source, path, size) in corpus order, into at most
    num_shards contiguous, non-empty shards."""
    total = sum(size for _, _, size in files_and_sizes)
    bounds = [round(total * k / num_shards) for k in range(num_shards + 1)]
    shards: list[list[Span]] = [[] for _ in range(num_shards)]

    def shard_at(position: int) -> int:
        return min(bisect.bisect_right(bounds, position) - 1, num_shards - 1)

    position = 0
    for source, path, size in files_and_sizes:
        if is_gzip(path) or size == 0:
            shards[shard_at(position)].append(Span(path, source=source))
        else:
            start = 0
            while start < size:
                k = shard_at(position + start)
                end = max(min(size, bounds[k + 1] - position), start + 1)
                shards[k].append(Span(path, start, None if end >= size else end, source))
                start = end
        position += size
    return [spans for spans in shards if spans]


def plan(paths: RunPaths, data: DataConfig) -> list[list[Span]]:
    """The run's shard plan, made on first use and read back afterwards. Paths inside the run
    folder are kept relative to it, so a run folder can be moved or copied."""
    root = paths.root
    saved = files.read_json_or_none(paths.shard_plan)
    listed = sources.files(paths, data)
    if (
        saved is not None
        and _changed(saved, paths, listed, data)
        and not _any_shard_made(saved, paths)
    ):
        saved = None  # a plan no task has tokenized anything of yet is made again, not kept
    if saved is None:
        for _, path in listed:
            if warning := misnamed(path):
                _log.warning(f"warning: {warning}")
        sizes = [(name, path, os.path.getsize(path)) for name, path in listed]
        shards = make_plan(sizes, data.num_shards)
        saved = {
            "format": FORMAT,
            "inputs": {portable(path, root): size for _, path, size in sizes},
            "num_shards": data.num_shards,
            "shards": [
                [[s.source, portable(s.path, root), s.start, s.end] for s in spans]
                for spans in shards
            ],
        }
        files.write_json(paths.shard_plan, saved)
    elif _changed(saved, paths, listed, data):
        raise ConfigError(
            f"data.inputs: the inputs or data.num_shards changed since {paths.shard_plan} was "
            "planned; use a new workdir (or force=tokenize) to tokenize a different corpus"
        )
    return [
        [Span(str(root / path), start, end, source) for source, path, start, end in spans]
        for spans in saved["shards"]
    ]


def _changed(saved: dict, paths: RunPaths, listed: list, data: DataConfig) -> bool:
    """The plan was made for other input files or another data.num_shards."""
    planned_for = sorted(portable(path, paths.root) for _, path in listed)
    return sorted(saved["inputs"]) != planned_for or saved["num_shards"] != data.num_shards


def _any_shard_made(saved: dict, paths: RunPaths) -> bool:
    return any(paths.shard_marker(i).exists() for i in range(len(saved["shards"])))


def planned_count(paths: RunPaths) -> int | None:
    """How many shards the written plan has; None before it is written."""
    saved = files.read_json_or_none(paths.shard_plan)
    return None if saved is None else len(saved["shards"])


def refuse_earlier_format(paths: RunPaths) -> None:
    """A data folder tokenized by an earlier version, whose held-out split was cut inside each
    shard (so it changed with the sharding), is refused in one line."""
    written = [files.read_json_or_none(p) for p in (paths.shard_plan, paths.manifest)]
    formats = {record.get("format", 1) for record in written if record is not None}
    if formats - {FORMAT}:
        raise ConfigError(
            f"data: {paths.data_dir} was tokenized by an earlier version, whose held-out split "
            "depended on data.num_shards; tokenize it again (force=tokenize in that run moves "
            "it to replaced/) or use a new workdir"
        )
