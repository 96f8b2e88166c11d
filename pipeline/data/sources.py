"""The sources of the corpus: `data.sources` (a weighted mixture, each source its own globs
and text key), or one source named "corpus" made of `data.inputs` (or the built-in corpus).

Sources are taken in name order, and each source's files in path order: that is the corpus
order, in which the shards cut the files and in which the first of duplicate documents is the
one kept (data.dedup).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import DataConfig, inputs
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.data import records
from pipeline.data.records import Document, Filtered, Reject, Span

SINGLE = "corpus"  # the name of the one source of data.inputs
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # a file and metric name, on any filesystem


@dataclass(frozen=True)
class Source:
    name: str
    inputs: tuple[str, ...]  # globs; empty: the built-in corpus
    text_key: str
    weight: float
    format: str = "auto"  # auto | text (pipeline.data.records.read)
    where: str | None = None  # a row filter on Parquet/Arrow columns

    def read(self, span: Span, max_document_bytes: int) -> Iterator[Document | Reject | Filtered]:
        """The documents, rejects and filtered-out rows of a span of one of this source's files."""
        return records.read(span, self.text_key, max_document_bytes, self.format, self.where)


def of(data: DataConfig) -> list[Source]:
    """The configured sources, in name order."""
    if not data.sources:
        return [Source(SINGLE, tuple(data.inputs), data.text_key, 1.0, data.format, data.where)]
    return [
        Source(
            name,
            tuple(s.inputs),
            s.text_key or data.text_key,
            float(s.weight),
            s.format or data.format,
            s.where,
        )
        for name, s in sorted(data.sources.items())
    ]


def by_name(data: DataConfig) -> dict[str, Source]:
    return {s.name: s for s in of(data)}


def weights(data: DataConfig) -> dict[str, float]:
    """Each source's sampling weight, normalized to sum to 1."""
    found = {s.name: s.weight for s in of(data)}
    total = sum(found.values())
    return {name: w / total for name, w in found.items()}


def matches(pattern: str) -> list[str]:
    """The readable files a glob names (a saved `datasets` folder: its Arrow files), as
    absolute paths."""
    return [os.path.abspath(p) for p in inputs.expand(pattern)[0]]


def files(paths: RunPaths, data: DataConfig) -> list[tuple[str, str]]:
    """(source name, path) of every corpus file, in corpus order: each file once, under the
    first of its names (pipeline.config.inputs.identity). A file that two sources name is a
    ConfigError (its documents would be counted twice)."""
    return _listed(paths, data)[0]


def merged_names(paths: RunPaths, data: DataConfig) -> str | None:
    """One warning line naming the files that the inputs name more than once (a symlink, a
    hard link, two globs), each read once; None when every file has one name."""
    merged = _listed(paths, data)[1]
    if not merged:
        return None
    groups = [f"{kept} (also {', '.join(others)})" for kept, others in sorted(merged.items())]
    shown = "; ".join(groups[:3]) + (f"; and {len(groups) - 3} more" if len(groups) > 3 else "")
    return (
        f"{_inputs_key(data)}: {len(groups)} file(s) named more than once (a link, or two "
        f"globs) are read once each: {shown}"
    )


def _listed(paths: RunPaths, data: DataConfig) -> tuple[list[tuple[str, str]], dict[str, list]]:
    """The corpus files in order, and each file read under one name -> its other names."""
    owner: dict[tuple[int, int], tuple[str, str]] = {}  # identity -> (source, name read)
    ordered: list[tuple[str, str]] = []
    merged: dict[str, list[str]] = {}
    for source in of(data):
        found = (
            {p for pattern in source.inputs for p in matches(pattern)}
            if source.inputs
            else {str(paths.builtin_corpus)}
        )
        for path in sorted(found):
            real = inputs.identity(path) if source.inputs else (-1, -1)  # built in: not yet made
            same = owner.setdefault(real, (source.name, path))
            if same[0] != source.name:
                raise ConfigError(
                    f"data.sources: {path} is in both {same[0]} and {source.name}; "
                    "give each file to one source"
                )
            if same[1] != path:
                merged.setdefault(same[1], []).append(path)
                continue
            ordered.append((source.name, path))
    return ordered, merged


def _inputs_key(data: DataConfig) -> str:
    return "data.sources" if data.sources else "data.inputs"


def portable(path: str, root: Path) -> str:
    """A path inside the run folder relative to it (the folder can move), others as they are."""
    return os.path.relpath(path, root) if Path(path).is_relative_to(root) else path


def corpus_settings(paths: RunPaths, data: DataConfig) -> dict:
    """What defines the documents read: the input files and their sizes (the built-in corpus:
    its size setting, as it is written only before the first submission), the text keys, the
    largest document. A corpus of one source is described as in earlier versions, so that its
    tokenizer stays valid."""
    builtin = not data.inputs and not data.sources
    described = {s.name: {"inputs": {}, "text_key": s.text_key, **_reading(s)} for s in of(data)}
    for name, path in files(paths, data):
        size = data.builtin_corpus_bytes if builtin else os.path.getsize(path)
        described[name]["inputs"][portable(path, paths.root)] = size
    limit = {"data.max_document_bytes": data.max_document_bytes}
    if not data.sources:
        single = described[SINGLE]
        reading = {f"data.{k}": v for k, v in _reading(of(data)[0]).items()}
        return {
            "data.inputs": single["inputs"],
            "data.text_key": single["text_key"],
            **reading,
            **limit,
        }
    return {"data.sources": described, **limit}


def _reading(source: Source) -> dict:
    """How a source's files are read, where not as by default (so earlier runs keep their
    tokenizer's fingerprint)."""
    found: dict = {}
    if source.format != "auto":
        found["format"] = source.format
    if source.where is not None:
        found["where"] = source.where
    return found
