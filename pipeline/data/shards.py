"""The shard plan: which bytes of which input files each tokenize task reads.

Deterministic for a given file list and shard count: the files in corpus order
(pipeline.data.sources) are laid end to end and cut into equal byte ranges, each file where its
format allows (pipeline.data.formats.units): plain JSONL anywhere (its readers align to lines),
Parquet between row groups, zstd between frames; gzip, Arrow and text files go whole. The plan is written once into the run, so a rerun reads exactly
what the first run planned. Which split a document goes to does not depend on the plan
(pipeline.data.split_assignment).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable

from pipeline.config import DataConfig
from pipeline.core import files, log
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import formats, sources
from pipeline.data.records import TEXT, Span
from pipeline.data.sources import portable

_log = log.get("plan")

FORMAT = 2  # of the data folder: 2, every document's split decided by its text (0.3 on)


Unit = tuple[int, int | None, int]  # start, end (None: to the end), bytes


def units_of(path: str, size: int, fmt: str = "auto", cut: bool = True) -> list[Unit] | None:
    """The units of one input (pipeline.data.formats.units); None: byte ranges at line starts.
    A text file (one document) and, unless `cut`, a file not worth cutting go whole."""
    if fmt == TEXT or size == 0:
        return [(0, None, size)]
    found = formats.kind(path)
    if found == "plain":
        return None
    if not cut or found in ("gzip", "arrow"):
        return [(0, None, size)]
    parts = formats.units(path, size) or [(0, None, size)]
    weights = sum(n for *_, n in parts) or 1
    return [(start, end, round(size * n / weights)) for start, end, n in parts]


def make_plan(
    files_and_sizes: list[tuple[str, str, int]],
    num_shards: int,
    units: Callable[[str, str, int], list[Unit] | None] | None = None,
) -> list[list[Span]]:
    """Cut the concatenated inputs, (source, path, size) in corpus order, into at most
    num_shards contiguous, non-empty shards. `units(source, path, size)`: where a file may be
    cut (default: by its content)."""
    total = sum(size for _, _, size in files_and_sizes)
    bounds = [round(total * k / num_shards) for k in range(num_shards + 1)]
    shards: list[list[Span]] = [[] for _ in range(num_shards)]
    units = units or (lambda _, path, size: units_of(path, size))

    def shard_at(position: int) -> int:
        return min(bisect.bisect_right(bounds, position) - 1, num_shards - 1)

    position = 0
    for source, path, size in files_and_sizes:
        parts = units(source, path, size)
        if parts is not None:
            offset = 0
            for start, end, n in parts:
                here = shards[shard_at(position + offset + n // 2)]  # where most of it lies
                if here and here[-1].path == path and here[-1].end == start:  # the next unit
                    here[-1] = Span(path, here[-1].start, end, source)
                else:
                    here.append(Span(path, start, end, source))
                offset += n
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
    changed = saved is not None and _changed(saved, paths, listed, data)
    if changed and not _any_shard_made(saved, paths):
        saved = None  # a plan no task has tokenized anything of yet is made again, not kept
    if saved is None:
        if merged := sources.merged_names(paths, data):
            _log.warning(f"warning: {merged}")
        for _, path in listed:
            if warning := formats.misnamed(path):
                _log.warning(f"warning: {warning}")
        sizes = [(name, path, os.path.getsize(path)) for name, path in listed]
        # only a file larger than a shard's share is worth reading the row groups or frames of
        share = sum(size for *_, size in sizes) / data.num_shards
        fmt = {s.name: s.format for s in sources.of(data)}
        shards = make_plan(
            sizes,
            data.num_shards,
            lambda name, path, size: units_of(path, size, fmt[name], size > share),
        )
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
    elif changed:
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
