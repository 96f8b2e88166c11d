"""Reading documents from JSONL / JSONL.gz, streaming, with every bad record accounted for.

A bad record never stops the run (unless strict) and is never dropped silently: it is handed
back as a `Reject` naming file:line and the reason, and the caller counts and logs it.
"""

from __future__ import annotations

import functools
import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from pipeline.core.errors import StageError

BOM = b"\xef\xbb\xbf"
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Span:
    """A part of one input file: whole (gzip) or a byte range that a reader aligns to lines."""

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

    def where(self) -> str:
        return f"{self.path}:{self.line}"


class BadRecord(StageError):
    """Raised in strict mode: the first bad record, as one line naming file:line."""


GZIP_MAGIC = b"\x1f\x8b"


@functools.lru_cache(maxsize=65536)
def is_gzip(path: str) -> bool:
    """Whether the file is gzip-compressed, by its first bytes, whatever its name says: a
    plain file named .gz is read as text, not dropped whole as a broken archive."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def misnamed(path: str) -> str | None:
    """A warning for a file whose name says otherwise than its content, or None."""
    named = path.endswith(".gz")
    if named == is_gzip(path):
        return None
    actual = "plain text" if named else "gzip-compressed"
    return f"{path} is {actual}, whatever its name says: read as {actual}"


def _open(span: Span) -> BinaryIO:
    if is_gzip(span.path):
        return gzip.open(span.path, "rb")
    f = open(span.path, "rb")  # noqa: SIM115 (the caller closes it)
    if span.start:
        # A range starting mid-file begins at the first line that starts inside it.
        f.seek(span.start - 1)
        f.readline()
    return f


def _first_line_number(span: Span) -> int:
    """1-based line number of the first line read from `span` (counted only when needed)."""
    if is_gzip(span.path) or span.start == 0:
        return 1
    # The reader skips to just past the first newline at or after byte start - 1: count the
    # newlines before that byte, plus that one.
    newlines = 1
    with open(span.path, "rb") as f:
        remaining = span.start - 1
        while remaining > 0:
            chunk = f.read(min(READ_CHUNK * 64, remaining))
            if not chunk:
                break
            newlines += chunk.count(b"\n")
            remaining -= len(chunk)
    return newlines + 1


def _lines(f: BinaryIO, span: Span, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """Yield (offset of the line, its bytes) for lines starting inside the span; None for a line
    longer than max_bytes, which is skipped without holding it in memory."""
    offset = f.tell() if not is_gzip(span.path) else 0
    while span.end is None or offset < span.end:
        line = f.readline(max_bytes + 1)
        if not line:
            return
        start = offset
        offset += len(line)
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while True:  # skip the rest of an oversized line chunk by chunk
                rest = f.readline(READ_CHUNK)
                offset += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            yield start, None
            continue
        yield start, line


def _parse(raw: bytes, text_key: str) -> str | tuple[str, str]:
    """The document text, or (reason, detail) for a bad record."""
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return "invalid_utf8", str(e)
    if not line.strip():
        return "blank_line", ""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return "malformed_json", str(e)
    if not isinstance(record, dict):
        return "not_an_object", type(record).__name__
    if text_key not in record:
        return "missing_text", f"no key {text_key!r}"
    text = record[text_key]
    if not isinstance(text, str):
        return "text_not_string", type(text).__name__
    if not text:
        return "empty_text", ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON allows escaped lone surrogates; UTF-8 does not
        return "invalid_unicode", str(e)
    return text


def read(span: Span, text_key: str, max_document_bytes: int) -> Iterator[Document | Reject]:
    """Stream the documents and rejects of one span, in file order."""
    first_line: int | None = None
    index = -1

    def line_number() -> int:
        nonlocal first_line
        if first_line is None:
            first_line = _first_line_number(span)
        return first_line + index

    with _open(span) as f:
        try:
            for index, (_, raw) in enumerate(_lines(f, span, max_document_bytes)):  # noqa: B007
                if raw is None:
                    yield Reject(
                        span.path, line_number(), "too_large", f"> {max_document_bytes} bytes"
                    )
                    continue
                parsed = _parse(raw, text_key)
                if isinstance(parsed, tuple):
                    yield Reject(span.path, line_number(), *parsed)
                else:
                    yield Document(parsed, len(raw))
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            index += 1
            yield Reject(span.path, line_number(), "truncated_gzip", str(e))
