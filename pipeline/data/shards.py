"""The shard plan: which bytes of which input files each tokenize task reads.

Deterministic for a given file list and shard count: files in sorted order are laid end to end
and cut into equal byte ranges (gzip files cannot be cut and go whole to one shard). The plan is
written once into the run, so a rerun reads exactly what the first run planned.
"""

from __future__ import annotations

import bisect
import glob
import os
from pathlib import Path

from pipeline.config import DataConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.records import Span, is_gzip


def input_paths(paths: RunPaths, data: DataConfig) -> list[str]:
    """The corpus files: the expanded `data.inputs` globs, or the built-in corpus."""
    if not data.inputs:
        return [str(paths.builtin_corpus)]
    found: set[str] = set()
    for pattern in data.inputs:
        found.update(os.path.abspath(p) for p in glob.glob(os.path.expanduser(pattern)))
    return sorted(p for p in found if os.path.isfile(p))


def input_spans(paths: RunPaths, data: DataConfig) -> list[Span]:
    return [Span(p) for p in input_paths(paths, data)]


def portable(path: str, root: Path) -> str:
    """A path inside the run folder relative to it (the folder can move), others as they are."""
    return os.path.relpath(path, root) if Path(path).is_relative_to(root) else path


def corpus_settings(paths: RunPaths, data: DataConfig) -> dict:
    """What defines the documents read: the input files and their sizes (the built-in corpus:
    its size setting, as it is written only before the first submission), the text key, the
    largest document."""
    if data.inputs:
        inputs = {portable(p, paths.root): os.path.getsize(p) for p in input_paths(paths, data)}
    else:
        inputs = {portable(str(paths.builtin_corpus), paths.root): data.builtin_corpus_bytes}
    return {
        "data.inputs": inputs,
        "data.text_key": data.text_key,
        "data.max_document_bytes": data.max_document_bytes,
    }


def make_plan(paths_and_sizes: list[tuple[str, int]], num_shards: int) -> list[list[Span]]:
    """Cut the concatenated inputs into at most num_shards contiguous, non-empty shards."""
    total = sum(size for _, size in paths_and_sizes)
    bounds = [round(total * k / num_shards) for k in range(num_shards + 1)]
    shards: list[list[Span]] = [[] for _ in range(num_shards)]

    def shard_at(position: int) -> int:
        return min(bisect.bisect_right(bounds, position) - 1, num_shards - 1)

    position = 0
    for path, size in paths_and_sizes:
        if is_gzip(path) or size == 0:
            shards[shard_at(position)].append(Span(path))
        else:
            start = 0
            while start < size:
                k = shard_at(position + start)
                end = max(min(size, bounds[k + 1] - position), start + 1)
                shards[k].append(Span(path, start, None if end >= size else end))
                start = end
        position += size
    return [spans for spans in shards if spans]


def plan(paths: RunPaths, data: DataConfig) -> list[list[Span]]:
    """The run's shard plan, made on first use and read back afterwards. Paths inside the run
    folder are kept relative to it, so a run folder can be moved or copied."""
    root = paths.root
    saved = files.read_json_or_none(paths.shard_plan)
    inputs = input_paths(paths, data)
    if saved is None:
        sizes = [(p, os.path.getsize(p)) for p in inputs]
        shards = make_plan(sizes, data.num_shards)
        saved = {
            "inputs": {portable(p, root): size for p, size in sizes},
            "num_shards": data.num_shards,
            "shards": [
                [[portable(s.path, root), s.start, s.end] for s in spans] for spans in shards
            ],
        }
        files.write_json(paths.shard_plan, saved)
    elif sorted(saved["inputs"]) != sorted(portable(p, root) for p in inputs) or (
        saved["num_shards"] != data.num_shards
    ):
        raise RuntimeError(
            f"data.inputs or data.num_shards changed since {paths.shard_plan} was planned; "
            "use a new workdir (or delete the data folder) to tokenize a different corpus"
        )
    return [[Span(str(root / p), s, e) for p, s, e in spans] for spans in saved["shards"]]


def planned_count(paths: RunPaths) -> int | None:
    """How many shards the written plan has; None before it is written."""
    saved = files.read_json_or_none(paths.shard_plan)
    return None if saved is None else len(saved["shards"])
