"""Tokenize one shard of the corpus into Megatron indexed datasets (.bin/.idx), one for each
split of each source (pipeline.data.split_outputs).

Byte-compatible with Megatron-LM's tools/preprocess_data.py (GPTSentencePieceTokenizer,
--append-eod): one sequence per document, the end-of-document id appended, in the bytes that
megatron-core's IndexedDatasetBuilder writes, in the smallest dtype for the vocabulary; a file
holds its documents in input order. Outputs appear under their final names only when complete,
followed by a marker with counts by source and checksums. Reading and parsing, encoding (one batch per thread) and writing overlap, so the
cores stay busy in sentencepiece: see docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from pipeline.config import DataConfig, PipelineConfig
from pipeline.core import files, log, provenance
from pipeline.core.paths import RunPaths
from pipeline.data import corpus, shards, sources
from pipeline.data.documents import source_where_key
from pipeline.data.pieces import PieceEncoder
from pipeline.data.records import BadRecord, Document, Filtered, Reject, Span
from pipeline.data.rejects import PREDICTED_LOST, UNKNOWN_LOSS
from pipeline.data.split_assignment import Splitter, digest
from pipeline.data.split_outputs import FileRecord, OneFile, SplitFiles
from pipeline.data.tokenizer import load

_log = log.get()

BATCH_BYTES = 1 << 20  # text per encode call: large enough to keep sentencepiece's threads busy
EMPTY = digest("")


def is_shard_complete(paths: RunPaths, index: int, fingerprint: str) -> bool:
    """A marker says the shard was made from what `fingerprint` stands for, and the files it
    describes are there with the sizes it recorded."""
    marker = files.read_json_or_none(paths.shard_marker(index))
    if marker is None or marker.get("fingerprint") != fingerprint:
        return False
    return all(
        os.path.exists(paths.root / f"{record['prefix']}{ext}")
        and os.path.getsize(paths.root / f"{record['prefix']}{ext}") == record[key]
        for by_split in marker["files"].values()
        for record in by_split.values()
        for ext, key in ((".bin", "bin_bytes"), (".idx", "idx_bytes"))
    )


@dataclass
class Batch:
    """Documents and rejects of one source, in file order, with the digest of each document
    (and of the empty text of an empty_text reject), computed while the last batch encodes."""

    source: str | None
    items: list[Document | Reject]
    digests: list[bytes | None]
    text_bytes: int = 0


def _batches(
    spans: list[Span], data: DataConfig, per_input: dict[str, Counter], filtered: Counter
) -> Iterator[Batch]:
    batch = Batch(None, [], [])
    reading = sources.by_name(data)
    default = sources.Source(sources.SINGLE, (), data.text_key, 1.0, data.format, data.where)
    for span in spans:
        if span.source != batch.source:
            if batch.items:
                yield batch
            batch = Batch(span.source, [], [])
        read_here = per_input[span.path]
        for item in reading.get(span.source, default).read(span, data.max_document_bytes):
            if isinstance(item, Filtered):
                read_here["filtered"] += item.rows
                filtered[span.source] += item.rows
                continue
            batch.items.append(item)
            read_here["documents" if isinstance(item, Document) else item.reason] += 1
            if isinstance(item, Reject) and item.lost != 1:
                _count_loss(item, read_here)
            if isinstance(item, Document):
                batch.digests.append(digest(item.text))
                batch.text_bytes += item.source_bytes
            else:
                batch.digests.append(EMPTY if item.reason == "empty_text" else None)
            if batch.text_bytes >= BATCH_BYTES:
                yield batch
                batch = Batch(span.source, [], [])
    if batch.items:
        yield batch


def _count_loss(damaged: Reject, read_here: Counter) -> None:
    """A damaged file's loss past its one reject, counted (pipeline.data.rejects weighs it) and
    said where the task's log shows it."""
    if damaged.lost is None:
        read_here[UNKNOWN_LOSS] += 1
        said = "how many records it lost cannot be told (no record of the stream's length)"
    else:
        read_here[PREDICTED_LOST] += damaged.lost - 1
        said = f"~{damaged.lost - 1:,} more records lost after it, predicted from those before"
    _log.warning(f"warning: {damaged.where()}: {damaged.reason}: {said}")


def _prefetched(it: Iterator, depth: int = 2) -> Iterator:
    """Read and parse the next batches in a thread while sentencepiece encodes this one."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def produce() -> None:
        try:
            for item in it:
                q.put(item)
            q.put(done)
        except BaseException as e:  # handed to the consumer, raised there
            q.put(e)

    threading.Thread(target=produce, daemon=True).start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


def _encoded(
    batches: Iterator[Batch], encoder: PieceEncoder, threads: int
) -> Iterator[tuple[Batch, list]]:
    """(batch, token ids of its documents), in input order. Each thread encodes whole batches
    (sentencepiece releases the GIL), so a long document holds up one thread, not all of them,
    and the cores keep encoding while this thread writes; a few batches in flight, and long
    documents encoded in pieces (pipeline.data.pieces), bound memory."""
    with ThreadPoolExecutor(threads, thread_name_prefix="encode") as pool:
        pending: deque = deque()
        for batch in batches:
            texts = [item.text for item in batch.items if isinstance(item, Document)]
            pending.append((batch, pool.submit(encoder.encode, texts)))
            if len(pending) > 2 * threads:
                head, future = pending.popleft()
                yield head, future.result()
        while pending:
            head, future = pending.popleft()
            yield head, future.result()


Sink = SplitFiles | OneFile


def _write_batch(
    sink: Sink,
    batch: Batch,
    encoded: list,
    eod: int,
    strict: bool,
    stats: Counter,
    rejected: Counter,
    log: Callable[[Reject], None],
) -> None:
    """Write one encoded batch, each document to its file in input order (as preprocess_data.py
    does); count everything."""
    next_ids = iter(encoded)
    for item, text_digest in zip(batch.items, batch.digests, strict=True):
        if isinstance(item, Document):
            ids = next(next_ids)
            stats["bytes_in"] += item.source_bytes
            if len(ids):
                sink.route(batch.source, text_digest).add(ids, text_digest)
                stats["documents"] += 1
                stats["tokens"] += len(ids) + 1  # and the end-of-document token
                continue
            stats["no_tokens"] += 1  # text that encodes to nothing: an empty document
        elif strict:
            raise BadRecord(
                f"data.strict: {item.where()}: {item.reason} {item.detail}".strip()
                + " (data.strict=false counts bad records in data/rejects/ and goes on)"
            )
        else:
            rejected[item.reason] += 1
            log(item)
        if text_digest is not None:  # preprocess_data.py writes an empty document for these
            sink.route(batch.source, text_digest).end_document(eod)
    sink.flush(eod)


def _max_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


@dataclass
class Counts:
    """What a tokenize task read, by source: documents, tokens and bytes, bad records by
    reason."""

    stats: dict[str | None, Counter] = field(default_factory=lambda: defaultdict(Counter))
    rejected: dict[str | None, Counter] = field(default_factory=lambda: defaultdict(Counter))
    # by input file: "documents" read (tokens or not), and bad records by reason, so that a
    # file none of whose records is a document is found (pipeline.data.verify)
    per_input: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    filtered: Counter = field(default_factory=Counter)  # rows a source's `where` left out

    def total(self, name: str) -> int:
        return sum(c[name] for c in list(self.stats.values()))  # read by _LogProgress too


def encode_spans(
    data: DataConfig,
    threads: int,
    spans: list[Span],
    sp,
    sink: Sink,
    rejects_file: Path,
    desc: str,
) -> Counts:
    """Tokenize `spans` into `sink` on `threads` threads. Bad records are counted by reason and
    logged to `rejects_file` (data.strict: the first one stops the run)."""
    from tqdm import tqdm

    threads = max(1, threads)
    counts = Counts()
    started = time.time()
    progress = tqdm(
        desc=desc, unit=" docs", file=sys.stderr, mininterval=5, disable=None, dynamic_ncols=True
    )
    in_log = _LogProgress(desc, counts, started) if progress.disable else contextlib.nullcontext()
    with (
        in_log,
        files.atomic_path(rejects_file) as rej_tmp,
        open(rej_tmp, "w") as rej_out,
    ):

        def log(item: Reject) -> None:
            rej_out.write(json.dumps(item.__dict__) + "\n")

        batches = _prefetched(_batches(spans, data, counts.per_input, counts.filtered))
        for batch, encoded in _encoded(batches, PieceEncoder(sp), threads):
            stats, rejected = counts.stats[batch.source], counts.rejected[batch.source]
            documents = stats["documents"]
            _write_batch(sink, batch, encoded, sp.eos_id(), data.strict, stats, rejected, log)
            progress.update(stats["documents"] - documents)
            tokens = counts.total("tokens")
            progress.set_postfix(tok_per_s=f"{tokens / (time.time() - started):.3g}")
    progress.close()
    return counts


class _LogProgress:
    """Where stderr is a log, not a terminal (a Slurm job's): a line every LOG_EVERY_S seconds
    with what the task has written so far, from a thread, so that a long document, which holds
    up the writes, does not silence it."""

    def __init__(self, desc: str, counts: Counts, started: float) -> None:
        self.desc, self.counts, self.started = desc, counts, started
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._report, daemon=True)

    def __enter__(self) -> _LogProgress:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    def _report(self) -> None:
        while not self.done.wait(LOG_EVERY_S):
            elapsed = time.time() - self.started
            # list() copies in one step: the reader thread may add keys meanwhile
            read = sum(sum(list(c.values())) for c in list(self.counts.per_input.values()))
            _log.info(
                f"{self.desc}: {elapsed:.0f} s, {read:,} records read, "
                f"{self.counts.total('documents'):,} documents and "
                f"{self.counts.total('tokens'):,} tokens written"
            )


LOG_EVERY_S = 10.0


def tokenize_spans(
    data: DataConfig,
    threads: int,
    spans: list[Span],
    sp,
    prefix: Path,
    rejects_file: Path,
    desc: str,
) -> tuple[Counter, Counter]:
    """Tokenize `spans` into one PREFIX.bin/.idx, published under those names only when whole.
    Returns (counts, rejects by reason)."""
    sink = OneFile(prefix, sp.vocab_size())
    counts = encode_spans(data, threads, spans, sp, sink, rejects_file, desc)
    sink.publish(prefix.parent)
    stats: Counter = sum(counts.stats.values(), Counter())
    rejected: Counter = sum(counts.rejected.values(), Counter())
    return stats, rejected


class SourceCounts(TypedDict):
    """What a shard read of one source."""

    documents: int  # with at least one token, so a sequence each
    no_token_documents: int
    tokens: int
    bytes_in: int
    rejected: dict[str, int]
    filtered: int  # Parquet/Arrow rows its `where` left out


class ShardRecord(TypedDict):
    """data/shard-NNNNN.done.json: what a shard holds and how it was made."""

    format: int  # of the data folder (pipeline.data.shards.FORMAT)
    made_from: dict  # the settings and tokenizer it depends on (pipeline.core.provenance)
    fingerprint: str
    shard: int
    spans: list  # [source, path, start byte, end byte or None]
    sources: dict[str, SourceCounts]
    files: dict[str, dict[str, FileRecord]]  # source -> split -> its indexed dataset
    documents: int
    tokens: int
    bytes_in: int
    rejected: dict[str, int]
    inputs: dict[str, dict[str, int]]  # input file -> "documents" read, bad records by reason
    rejects_file: str
    vocab_size: int
    seconds: float
    max_rss_mb: float


def tokenize_shard(
    cfg: PipelineConfig, index: int, spans: list[Span], made_from: dict
) -> ShardRecord:
    paths = RunPaths.of(cfg.workdir)
    sp = load(paths.tokenizer_model)
    started = time.time()
    rejects_file = paths.shard_rejects(index)
    names = list(dict.fromkeys(span.source for span in spans))
    splitter = Splitter(cfg.data.split, cfg.data.split_seed)
    sink = SplitFiles(paths, index, names, sp.vocab_size(), splitter)
    try:
        counts = encode_spans(
            cfg.data, cfg.cluster.cpus_per_task, spans, sp, sink, rejects_file, f"shard {index}"
        )
        published = sink.publish()
    except BaseException:
        sink.remove_partial()
        raise
    per_source: dict[str, SourceCounts] = {
        name: {
            "documents": counts.stats[name]["documents"],
            "no_token_documents": counts.stats[name]["no_tokens"],
            "tokens": counts.stats[name]["tokens"],
            "bytes_in": counts.stats[name]["bytes_in"],
            "rejected": dict(counts.rejected[name]),
            "filtered": counts.filtered[name],
        }
        for name in names
    }
    rejected: Counter = sum(counts.rejected.values(), Counter())
    marker: ShardRecord = {
        "format": shards.FORMAT,
        "made_from": made_from,
        "fingerprint": provenance.fingerprint(made_from),
        "shard": index,
        "spans": [[s.source, s.path, s.start, s.end] for s in spans],
        "sources": per_source,
        "files": published,
        "documents": counts.total("documents"),
        "tokens": counts.total("tokens"),
        "bytes_in": counts.total("bytes_in"),
        "rejected": dict(rejected),
        "inputs": {path: dict(read) for path, read in counts.per_input.items()},
        "rejects_file": str(rejects_file),
        "vocab_size": sp.vocab_size(),
        "seconds": round(time.time() - started, 3),
        "max_rss_mb": _max_rss_mb(),  # of this process: what a task needs (--mem on Slurm)
    }
    files.write_json(paths.shard_marker(index), marker)
    mb = marker["bytes_in"] / 1e6
    filtered = "".join(
        f", {n:,} rows left out by {source_where_key(name)}"
        for name, n in sorted(counts.filtered.items())
        if n
    )
    _log.info(
        f"shard {index}: {marker['documents']} documents, {marker['tokens']} tokens, "
        f"{mb:.1f} MB in {marker['seconds']:.1f} s ({mb / max(marker['seconds'], 1e-9):.2f} MB/s), "
        f"{sum(rejected.values())} rejected{filtered}, max RSS {marker['max_rss_mb']:.0f} MB"
    )
    return marker


def prepare(cfg: PipelineConfig) -> None:
    """Before the array is submitted: the built-in corpus (when no data.inputs) and the shard
    plan, which fixes the number of tasks."""
    paths = RunPaths.of(cfg.workdir)
    if not cfg.data.inputs and not cfg.data.sources:
        corpus.build(paths.builtin_corpus, cfg.data.builtin_corpus_bytes)
    shards.plan(paths, cfg.data)


def run_task(cfg: PipelineConfig, index: int, made_from: dict) -> ShardRecord:
    """Tokenize shard `index` unless it is complete, made from `made_from`. Out of space, it
    removes its partial files and says so in one line; complete shards are untouched."""
    paths = RunPaths.of(cfg.workdir)
    if is_shard_complete(paths, index, provenance.fingerprint(made_from)):
        return files.read_json(paths.shard_marker(index))
    with files.reporting_space(f"shard {index} ({paths.data_dir})"):
        spans = shards.plan(paths, cfg.data)[index]
        return tokenize_shard(cfg, index, spans, made_from)
