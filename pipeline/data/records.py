"""Reading documents from JSONL (plain, gzip, zstd), Parquet, Arrow or text files, streaming, with every bad record accounted for.

A bad record never stops the run (unless strict) and is never dropped silently: it is handed
back as a `Reject` naming file:line and the reason, and the caller counts and logs it.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from pipeline.core.errors import ConfigError, StageError
from pipeline.data import formats
from pipeline.data.documents import Document, Filtered, Reject, Span, where_key

BOM = b"\xef\xbb\xbf"
READ_CHUNK = 1 << 20


class BadRecord(StageError):
    """Raised in strict mode: the first bad record, as one line naming file:line."""


def _open(span: Span) -> tuple[BinaryIO, int, Callable[[int], bool]]:
    """The span's bytes positioned at its first line, that line's offset, and whether a line
    starting at an offset is still the span's. A plain file's range and a zstd span's frames
    begin at the first line that starts inside them; a gzip file is read whole."""
    found = formats.kind(span.path)
    if found == "gzip":
        return gzip.open(span.path, "rb"), 0, lambda _: True
    if found == "zstd":
        reader = formats.ZstdReader(span.path, span.start, span.end)
        f = io.BufferedReader(reader, READ_CHUNK)
        offset = 0
        if span.start and not _frames_end_a_line(span.path, span.start):
            offset = len(f.readline())  # the end of a line that began in the frames before
        return f, offset, lambda at: reader.boundary is None or at < reader.boundary
    f = open(span.path, "rb")  # noqa: SIM115 (the caller closes it)
    if span.start:
        # A range starting mid-file begins at the first line that starts inside it.
        f.seek(span.start - 1)
        f.readline()
    return f, f.tell(), lambda at: span.end is None or at < span.end


def _frames_end_a_line(path: str, start: int) -> bool:
    """Whether the zstd frames before byte `start` end with a newline (decompressing only the
    last of them)."""
    previous = next((s for s, e in formats.zstd_frames_cached(path) if e == start), 0)
    last = b"\n"
    with io.BufferedReader(formats.ZstdReader(path, previous, start, False), READ_CHUNK) as f:
        while chunk := f.read(READ_CHUNK):
            last = chunk[-1:]
    return last == b"\n"


def _first_line_number(span: Span) -> int:
    """1-based line number of the first line read from `span` (counted only when needed)."""
    found = formats.kind(span.path)
    if found == "gzip" or span.start == 0:
        return 1
    newlines = 1
    if found == "zstd":  # the newlines of the frames before, and the line ending in this one
        frames = formats.ZstdReader(span.path, 0, span.start, run_on=False)
        with io.BufferedReader(frames, READ_CHUNK) as f:
            newlines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(READ_CHUNK), b""))
        return newlines + (1 if _frames_end_a_line(span.path, span.start) else 2)
    # The reader skips to just past the first newline at or after byte start - 1: count the
    # newlines before that byte, plus that one.
    with open(span.path, "rb") as f:
        remaining = span.start - 1
        while remaining > 0:
            chunk = f.read(min(READ_CHUNK * 64, remaining))
            if not chunk:
                break
            newlines += chunk.count(b"\n")
            remaining -= len(chunk)
    return newlines + 1


def _lines(
    f: BinaryIO, offset: int, belongs: Callable[[int], bool], max_bytes: int
) -> Iterator[tuple[int, bytes | None]]:
    """Yield (offset of the line, its bytes) for the span's lines; None for a line longer than
    max_bytes, which is skipped without holding it in memory."""
    while belongs(offset):
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


TEXT = "text"  # data.format / data.sources.NAME.format: a whole file is one document
TRUNCATED = (EOFError, zlib.error, gzip.BadGzipFile)


def read(
    span: Span,
    text_key: str,
    max_document_bytes: int,
    fmt: str = "auto",
    where: str | None = None,
) -> Iterator[Document | Reject | Filtered]:
    """Stream the documents and rejects of one span, in file order: records of JSONL (plain,
    gzip or zstd), rows of Parquet and Arrow files (`where` selects them), or with fmt=text
    the whole file as one document."""
    found = formats.kind(span.path)
    if where and found not in formats.COLUMNAR:
        raise ConfigError(
            f"{where_key(span)}: filters the rows of Parquet or Arrow files; {span.path} is "
            f"{found} (JSONL): give that source no where"
        )
    if fmt == TEXT:
        yield from _read_text(span, max_document_bytes)
    elif found in formats.COLUMNAR:
        from pipeline.data import columnar

        yield from columnar.read(span, found, text_key, max_document_bytes, where)
    else:
        yield from _read_jsonl(span, text_key, max_document_bytes)


def _read_text(span: Span, max_document_bytes: int) -> Iterator[Document | Reject]:
    try:
        with formats.open_bytes(span.path) as f:
            raw = _read_at_most(f, max_document_bytes + 1)
    except TRUNCATED as e:
        yield Reject(span.path, 1, f"truncated_{formats.kind(span.path)}", str(e))
        return
    if len(raw) > max_document_bytes:
        yield Reject(span.path, 1, "too_large", f"> {max_document_bytes} bytes")
        return
    try:
        text = raw.removeprefix(BOM).decode("utf-8")
    except UnicodeDecodeError as e:
        yield Reject(span.path, 1, "invalid_utf8", str(e))
        return
    yield Document(text, len(raw)) if text else Reject(span.path, 1, "empty_text")


def _read_at_most(f: BinaryIO, limit: int) -> bytes:
    """Up to `limit` bytes, read in chunks (never a buffer of `limit` bytes asked for ahead)."""
    chunks, size = [], 0
    while size < limit and (chunk := f.read(min(READ_CHUNK * 16, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _read_jsonl(span: Span, text_key: str, max_document_bytes: int) -> Iterator[Document | Reject]:
    first_line: int | None = None
    index = -1
    found = formats.kind(span.path)

    def line_number() -> int:
        nonlocal first_line
        if first_line is None:
            first_line = _first_line_number(span)
        return first_line + index

    try:
        f, offset, belongs = _open(span)
    except TRUNCATED as e:  # inside the line that runs on from the frames before
        line = _first_line_number(span) - 1
        yield Reject(span.path, line, f"truncated_{found}", str(e), lost=_lost(span, 0, 0))
        return
    read_to = offset  # the decompressed bytes read as lines
    with f:
        try:
            lines = _lines(f, offset, belongs, max_document_bytes)
            for index, (start, raw) in enumerate(lines):  # noqa: B007
                if raw is None:
                    yield Reject(
                        span.path, line_number(), "too_large", f"> {max_document_bytes} bytes"
                    )
                    continue
                if not raw.endswith(b"\n") and getattr(f.raw, "cut_short", False):
                    break  # ended by damage in the next span's frames, which reports it
                read_to = start + len(raw)
                parsed = _parse(raw, text_key)
                if isinstance(parsed, tuple):
                    yield Reject(span.path, line_number(), *parsed)
                else:
                    yield Document(parsed, len(raw))
        except TRUNCATED as e:
            index += 1
            lost = _lost(span, index, read_to - offset)
            yield Reject(span.path, line_number(), f"truncated_{found}", str(e), lost=lost)


def _lost(span: Span, lines: int, read: int) -> int | None:
    """The records of a damaged stream's span from the damage on, the damaged one included:
    the decompressed bytes past the `read` bytes of its first `lines` lines (those the damage
    kept from the reader, and those predicted after it), at the bytes a line of those (None:
    cannot be told)."""
    zstd = formats.kind(span.path) == "zstd"
    before, after = formats.lost_bytes(span.path, *((span.start, span.end) if zstd else (0, None)))
    if after is None:
        return None
    unread = max(0, before + after - read)
    if not unread:
        return 1
    return 1 + round(unread * lines / read) if lines and read else None
