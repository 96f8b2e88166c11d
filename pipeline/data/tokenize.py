"""Tokenize one shard of the corpus into a Megatron indexed dataset (.bin/.idx).

Byte-compatible with Megatron-LM's tools/preprocess_data.py (GPTSentencePieceTokenizer,
--append-eod): one sequence per document, the end-of-document id appended, in the bytes that
megatron-core's IndexedDatasetBuilder writes, in the smallest dtype for the vocabulary. Outputs
appear under their final names only when complete, followed by a marker with counts and
checksums. Reading and parsing, encoding (one batch per thread) and writing overlap, so the
cores stay busy in sentencepiece: see docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypedDict

from pipeline.config import DataConfig, PipelineConfig
from pipeline.core import files, provenance
from pipeline.core.errors import OutOfSpace
from pipeline.core.paths import RunPaths
from pipeline.data import corpus, shards
from pipeline.data.indexed import ShardWriter
from pipeline.data.records import BadRecord, Document, Reject, Span, read
from pipeline.data.tokenizer import load

BATCH_BYTES = 1 << 20  # text per encode call: large enough to keep sentencepiece's threads busy


def is_shard_complete(paths: RunPaths, index: int, fingerprint: str) -> bool:
    """A marker says the shard was made from what `fingerprint` stands for, and the files it
    describes are there with the sizes it recorded."""
    marker = files.read_json_or_none(paths.shard_marker(index))
    if marker is None or marker.get("fingerprint") != fingerprint:
        return False
    prefix = paths.shard_prefix(index)
    return all(
        os.path.exists(f"{prefix}{ext}") and os.path.getsize(f"{prefix}{ext}") == marker[key]
        for ext, key in ((".bin", "bin_bytes"), (".idx", "idx_bytes"))
    )


def _batches(spans: list[Span], data: DataConfig) -> Iterator[list[Document | Reject]]:
    batch: list[Document | Reject] = []
    size = 0
    for span in spans:
        for item in read(span, data.text_key, data.max_document_bytes):
            batch.append(item)
            if isinstance(item, Document):
                size += item.source_bytes
            if size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


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


def _encoded(batches: Iterator[list], sp, threads: int) -> Iterator[tuple[list, list[list[int]]]]:
    """(batch, token ids of its documents), in input order. Each thread encodes whole batches
    (sentencepiece releases the GIL), so a long document holds up one thread, not all of them,
    and the cores keep encoding while this thread writes; a few batches in flight bound memory."""
    with ThreadPoolExecutor(threads, thread_name_prefix="encode") as pool:
        pending: deque = deque()
        for batch in batches:
            texts = [item.text for item in batch if isinstance(item, Document)]
            pending.append((batch, pool.submit(sp.encode, texts, num_threads=1)))
            if len(pending) > 2 * threads:
                head, future = pending.popleft()
                yield head, future.result()
        while pending:
            head, future = pending.popleft()
            yield head, future.result()


def _write_batch(
    writer: ShardWriter,
    batch: list[Document | Reject],
    encoded: list[list[int]],
    eod: int,
    strict: bool,
    stats: Counter,
    rejected: Counter,
    log: Callable[[Reject], None],
) -> None:
    """Write one encoded batch in input order (as preprocess_data.py does); count everything."""
    run: list[list[int]] = []  # consecutive documents, written together

    def flush() -> None:
        if run:
            stats["tokens"] += writer.add_documents(run, eod)
            stats["documents"] += len(run)
            run.clear()

    next_ids = iter(encoded)
    for item in batch:
        if isinstance(item, Document):
            ids = next(next_ids)
            stats["bytes_in"] += item.source_bytes
            if ids:
                run.append(ids)
                continue
            stats["no_tokens"] += 1  # text that encodes to nothing: an empty document
        elif strict:
            raise BadRecord(f"{item.where()}: {item.reason} {item.detail}".strip())
        else:
            rejected[item.reason] += 1
            log(item)
        flush()
        if isinstance(item, Document) or item.reason == "empty_text":
            # preprocess_data.py writes an empty document (no sequence) for these
            writer.end_document()
    flush()


def _max_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def tokenize_spans(
    data: DataConfig,
    threads: int,
    spans: list[Span],
    sp,
    prefix: Path,
    rejects_file: Path,
    desc: str,
) -> tuple[Counter, Counter]:
    """Tokenize `spans` into PREFIX.bin/.idx on `threads` threads, published under those names
    only when whole. Bad records are counted by reason and logged to `rejects_file`
    (data.strict: the first one stops the run). Returns (counts, rejects by reason)."""
    from tqdm import tqdm

    threads = max(1, threads)
    partial = Path(f"{prefix}.partial")
    writer = ShardWriter(f"{partial}.bin", sp.vocab_size())
    stats: Counter = Counter()
    rejected: Counter = Counter()
    started = time.time()
    progress = tqdm(
        desc=desc, unit=" docs", file=sys.stderr, mininterval=5, disable=None, dynamic_ncols=True
    )
    with files.atomic_path(rejects_file) as rej_tmp, open(rej_tmp, "w") as rej_out:

        def log(item: Reject) -> None:
            rej_out.write(json.dumps(item.__dict__) + "\n")

        for batch, encoded in _encoded(_prefetched(_batches(spans, data)), sp, threads):
            documents = stats["documents"]
            _write_batch(writer, batch, encoded, sp.eos_id(), data.strict, stats, rejected, log)
            progress.update(stats["documents"] - documents)
            progress.set_postfix(tok_per_s=f"{stats['tokens'] / (time.time() - started):.3g}")
    progress.close()
    writer.finalize(f"{partial}.idx")
    files.publish(partial, prefix, (".bin", ".idx"))
    return stats, rejected


class ShardRecord(TypedDict):
    """data/shard-NNNNN.done.json: what a shard holds and how it was made."""

    made_from: dict  # the settings and tokenizer it depends on (pipeline.core.provenance)
    fingerprint: str
    shard: int
    spans: list  # [path, start byte, end byte or None]
    documents: int
    no_token_documents: int
    tokens: int
    bytes_in: int
    rejected: dict[str, int]
    rejects_file: str
    bin_bytes: int
    idx_bytes: int
    bin_sha256: str
    idx_sha256: str
    vocab_size: int
    seconds: float
    max_rss_mb: float


def tokenize_shard(
    cfg: PipelineConfig, index: int, spans: list[Span], made_from: dict
) -> ShardRecord:
    paths = RunPaths.of(cfg.workdir)
    prefix = paths.shard_prefix(index)
    sp = load(paths.tokenizer_model)
    started = time.time()
    rejects_file = paths.shard_rejects(index)
    threads = cfg.cluster.cpus_per_task
    stats, rejected = tokenize_spans(
        cfg.data, threads, spans, sp, prefix, rejects_file, f"shard {index}"
    )
    marker: ShardRecord = {
        "made_from": made_from,
        "fingerprint": provenance.fingerprint(made_from),
        "shard": index,
        "spans": [[s.path, s.start, s.end] for s in spans],
        "documents": stats["documents"],
        "no_token_documents": stats["no_tokens"],
        "tokens": stats["tokens"],
        "bytes_in": stats["bytes_in"],
        "rejected": dict(rejected),
        "rejects_file": str(rejects_file),
        "bin_bytes": os.path.getsize(f"{prefix}.bin"),
        "idx_bytes": os.path.getsize(f"{prefix}.idx"),
        "bin_sha256": files.sha256(f"{prefix}.bin"),
        "idx_sha256": files.sha256(f"{prefix}.idx"),
        "vocab_size": sp.vocab_size(),
        "seconds": round(time.time() - started, 3),
        "max_rss_mb": _max_rss_mb(),  # of this process: what a task needs (--mem on Slurm)
    }
    files.write_json(paths.shard_marker(index), marker)
    mb = stats["bytes_in"] / 1e6
    print(
        f"shard {index}: {stats['documents']} documents, {stats['tokens']} tokens, "
        f"{mb:.1f} MB in {marker['seconds']:.1f} s ({mb / max(marker['seconds'], 1e-9):.2f} MB/s), "
        f"{sum(rejected.values())} rejected, max RSS {marker['max_rss_mb']:.0f} MB",
        file=sys.stderr,
    )
    return marker


def prepare(cfg: PipelineConfig) -> None:
    """Before the array is submitted: the built-in corpus (when no data.inputs) and the shard
    plan, which fixes the number of tasks."""
    paths = RunPaths.of(cfg.workdir)
    if not cfg.data.inputs:
        corpus.build(paths.builtin_corpus, cfg.data.builtin_corpus_bytes)
    shards.plan(paths, cfg.data)


def run_task(cfg: PipelineConfig, index: int, made_from: dict) -> ShardRecord:
    """Tokenize shard `index` unless it is complete, made from `made_from`. Out of space, it
    removes its partial files and says so in one line; complete shards are untouched."""
    paths = RunPaths.of(cfg.workdir)
    if is_shard_complete(paths, index, provenance.fingerprint(made_from)):
        return files.read_json(paths.shard_marker(index))
    prefix = paths.shard_prefix(index)
    try:
        with files.reporting_space(f"shard {index} ({prefix})"):
            spans = shards.plan(paths, cfg.data)[index]
            return tokenize_shard(cfg, index, spans, made_from)
    except OutOfSpace:
        for suffix in (".bin", ".idx"):
            Path(f"{prefix}.partial{suffix}").unlink(missing_ok=True)
        raise
