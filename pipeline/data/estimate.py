"""Before tokenizing: each source's tokens, estimated from its content for the plan's epochs.

The head of each file is read as the tokenize step reads it (its reader, text key, row filter):
the text and documents it holds per decompressed byte (JSONL, text files) or per row (Parquet,
Arrow), scaled to the whole file by its decompressed size or its rows. Text becomes tokens at
the bytes a token of the run's tokenizer on that sample when there is one, else at a figure
for the vocabulary size; each document adds its end-of-document token. It is an estimate: the
index step counts the tokenized data, and that count decides.
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass, field

from pipeline.config import PipelineConfig, derived
from pipeline.core.paths import RunPaths
from pipeline.data import formats, sources
from pipeline.data.documents import Document, Filtered, Span
from pipeline.data.records import TEXT

SAMPLE_BYTES = 1 << 20  # of decompressed input read from the head of each file
SAMPLE_FILES = 16  # files of a source read; the others are scaled from them by size
ENCODE_CHARACTERS = 1 << 18  # of a source's sampled text, encoded to measure its tokenizer
# Bytes a token of a sentencepiece BPE model by vocabulary size, measured on the built-in
# corpus (English prose and docstrings): 512 -> 1.9, 2000 -> 3.3, 8000 -> 4.3, 32000 -> 4.6.
BYTES_PER_TOKEN = ((64, 1.0), (512, 1.9), (2000, 3.3), (8000, 4.2), (32000, 4.5), (131072, 4.8))


@dataclass
class Content:
    """What some files hold: text bytes and documents (scaled to the whole files), and the
    texts read, for measuring a tokenizer on."""

    text_bytes: float = 0.0
    documents: float = 0.0
    texts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Estimate:
    tokens: dict[str, int]  # by source, all splits
    how: str  # said beside the figures


def estimate(cfg: PipelineConfig) -> Estimate:
    """Each source's tokens, from a sample of its files' content."""
    d = cfg.data
    paths = RunPaths.of(cfg.workdir)
    builtin = not d.inputs and not d.sources
    reading = sources.by_name(d)
    by_source: dict[str, list[str]] = {name: [] for name in reading}
    for name, path in sources.files(paths, d):
        by_source[name].append(path)
    contents: dict[str, Content] = {}
    for name, files in by_source.items():
        if builtin and not paths.builtin_corpus.exists():  # written when the run starts
            contents[name] = Content(text_bytes=d.builtin_corpus_bytes)
        else:
            contents[name] = _source_content(reading[name], files, d.max_document_bytes)
    model = tokenizer_at_hand(cfg)
    sp = None
    if model is not None:
        from pipeline.data.tokenizer import load

        sp = load(model)
    per_token = {name: bytes_per_token(sp, c.texts) for name, c in contents.items()}
    # tokenizer.vocab_size is none beside a given tokenizer, which is then at hand
    vocab = sp.vocab_size() if sp else cfg.tokenizer.vocab_size
    guessed = guessed_bytes_per_token(vocab)
    tokens = {
        name: round(c.text_bytes / (per_token[name] or guessed) + c.documents)
        for name, c in contents.items()
    }
    measured = {name: f for name, f in per_token.items() if f is not None}
    if measured:
        figures = ", ".join(
            f"{f:.2f}" if len(contents) == 1 else f"{name} {f:.2f}" for name, f in measured.items()
        )
        how = f"the tokenizer's {figures} bytes a token"
    else:
        how = f"~{guessed:.1f} bytes a token, typical of {vocab:,} pieces"
    return Estimate(tokens, f"estimated from a sample of each file's text at {how}")


def tokenizer_at_hand(cfg: PipelineConfig) -> str | None:
    """The run's sentencepiece model, when there is one yet: given, or trained in this run or
    in data.prepared's."""
    given = derived.given_tokenizer(cfg)  # tokenizer.model, or model.init_from's
    candidates = [given] if given else []
    candidates += [
        str(RunPaths.of(r).tokenizer_model) for r in (cfg.workdir, cfg.data.prepared) if r
    ]
    return next((m for m in candidates if os.path.isfile(m)), None)


def bytes_per_token(sp, texts: list[str]) -> float | None:
    """The tokenizer's text bytes a token on (the first ENCODE_CHARACTERS of) `texts`; None
    without a tokenizer or text."""
    sample = list(_first_characters(texts, ENCODE_CHARACTERS))
    encoded = sum(len(ids) for ids in sp.encode(sample)) if sp is not None and sample else 0
    if not encoded:
        return None
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in sample) / encoded


def guessed_bytes_per_token(vocab_size: int) -> float:
    """BYTES_PER_TOKEN interpolated in the logarithm of the vocabulary size."""
    sizes = [math.log(v) for v, _ in BYTES_PER_TOKEN]
    at = math.log(max(vocab_size, 2))
    i = min(max(bisect.bisect_right(sizes, at), 1), len(sizes) - 1)
    (x0, y0), (x1, y1) = (
        (sizes[i - 1], BYTES_PER_TOKEN[i - 1][1]),
        (sizes[i], BYTES_PER_TOKEN[i][1]),
    )
    return max(
        BYTES_PER_TOKEN[0][1], min(BYTES_PER_TOKEN[-1][1], y0 + (y1 - y0) * (at - x0) / (x1 - x0))
    )


def _first_characters(texts: list[str], limit: int):
    size = 0
    for text in texts:
        if size >= limit:
            return
        piece = text[: limit - size]
        size += len(piece)
        yield piece


def _source_content(source: sources.Source, files: list[str], max_bytes: int) -> Content:
    """A source's content: up to SAMPLE_FILES of its files, spread over the list, sampled;
    the others scaled from them by their sizes."""
    if not files:
        return Content()
    step = max(1, len(files) // SAMPLE_FILES)
    sampled = files[::step][:SAMPLE_FILES]
    total = Content()
    for path in sampled:
        found = file_content(source, path, max_bytes)
        total.text_bytes += found.text_bytes
        total.documents += found.documents
        total.texts += found.texts
    sampled_size = sum(os.path.getsize(p) for p in sampled)
    all_size = sum(os.path.getsize(p) for p in files)
    scale = all_size / sampled_size if sampled_size else 1.0
    return Content(total.text_bytes * scale, total.documents * scale, total.texts)


def file_content(source: sources.Source, path: str, max_bytes: int) -> Content:
    """The text and documents of one file, from its head."""
    found = formats.kind(path)
    if source.format == TEXT:
        with formats.open_bytes(path) as f:
            head = f.read(SAMPLE_BYTES).decode("utf-8", "replace")
        return Content(decompressed_size(path), 1.0, [head])
    if found in formats.COLUMNAR:
        return _rows_content(source, path, found, max_bytes)
    content, decoded, whole = Content(), 0, True
    for item in source.read(Span(path, source=source.name), max_bytes):
        if isinstance(item, Document):
            content.text_bytes += len(item.text.encode("utf-8", "surrogatepass"))
            content.documents += 1
            content.texts.append(item.text)
            decoded += item.source_bytes
        if decoded >= SAMPLE_BYTES:
            whole = False
            break
    if whole or not decoded:
        return content
    scale = decompressed_size(path) / decoded
    return Content(content.text_bytes * scale, content.documents * scale, content.texts)


def _rows_content(source: sources.Source, path: str, found: str, max_bytes: int) -> Content:
    """A Parquet or Arrow file's content: its first rows (as its `where` keeps them), scaled
    to all its rows."""
    content, rows = Content(), 0
    for item in source.read(Span(path, source=source.name), max_bytes):
        if isinstance(item, Document):
            content.text_bytes += item.source_bytes
            content.documents += 1
            content.texts.append(item.text)
        rows += item.rows if isinstance(item, Filtered) else 1  # a document or a reject
        if content.text_bytes >= SAMPLE_BYTES:
            break
    total = row_count(path, found)
    scale = total / rows if rows and total else 1.0
    return Content(content.text_bytes * scale, content.documents * scale, content.texts)


def row_count(path: str, found: str) -> int | None:
    """The rows of a Parquet file (its footer) or an Arrow file or stream (its batches)."""
    import pyarrow as pa

    try:
        if found == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        source = pa.memory_map(path)
        try:
            reader = pa.ipc.open_file(source)
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            return sum(batch.num_rows for batch in pa.ipc.open_stream(source))
    except (pa.ArrowException, OSError):
        return None


def decompressed_size(path: str) -> float:
    """A file's content size: as it is (plain), as its zstd frames record it, else its size
    at the compression ratio of its first bytes."""
    size = os.path.getsize(path)
    found = formats.kind(path)
    if found not in ("gzip", "zstd"):
        return float(size)
    if found == "zstd":
        recorded = [formats.content_size(path, start) for start, _ in formats.zstd_frames(path)]
        if recorded and None not in recorded:
            return float(sum(recorded))
    head = min(size, SAMPLE_BYTES)
    decoded = formats.decoded_head(path, head)
    return size * decoded / head if head else 0.0
