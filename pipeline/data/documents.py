"""What readers hand back: a span of an input file to read, and for each record a Document,
a Reject naming where it is and why, or a count of rows a filter left out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A part of one input file (pipeline.data.formats.units): a byte range that a reader aligns
    to lines (plain JSONL), zstd frames (byte offsets), Parquet row groups (group indices), or
    the whole file."""

    path: str
    start: int = 0
    end: int | None = None  # None: to the end of the file
    source: str | None = None  # the corpus source the file belongs to (pipeline.data.sources)


@dataclass(frozen=True)
class Document:
    text: str
    source_bytes: int


@dataclass(frozen=True)
class Reject:
    path: str
    line: int
    reason: str
    detail: str = ""
    unit: str = "line"  # or "row", of a Parquet or Arrow file (1-based)
    # the records it stands for: 1 for a bad record; for a damaged file, that record and those
    # predicted lost after the damage; None where that cannot be told (a stream cut short)
    lost: int | None = 1

    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.unit == "line" else f"{self.path} row {self.line}"


@dataclass(frozen=True)
class Filtered:
    """Rows of a Parquet or Arrow file that a source's `where` left out."""

    path: str
    rows: int


def where_key(span: Span) -> str:
    """The config key of the row filter that applies to a span's file."""
    return source_where_key(span.source)


def source_where_key(source: str | None) -> str:
    """The config key of a source's row filter: data.where for the one source of data.inputs."""
    named = source not in (None, "corpus")
    return f"data.sources.{source}.where" if named else "data.where"
