"""Tokenize one shard of the corpus into a Megatron indexed dataset (.bin/.idx).

Byte-compatible with Megatron-LM's tools/preprocess_data.py (GPTSentencePieceTokenizer,
--append-eod): one sequence per document, the end-of-document id appended, written with
megatron-core's IndexedDatasetBuilder in the smallest dtype for the vocabulary. Outputs appear
under their final names only when complete, followed by a marker with counts and checksums.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig

from pipeline import files
from pipeline.layout import RunLayout
from pipeline.records import BadRecord, Document, Reject, Span, read
from pipeline.shards import plan

BATCH_BYTES = 1 << 20  # text per encode call: large enough to keep sentencepiece's threads busy


def marker_path(prefix: Path) -> Path:
    return prefix.with_suffix(".done.json")


def rejects_path(cfg: DictConfig, index: int) -> Path:
    return RunLayout.of(cfg.workdir).data_dir / "rejects" / f"shard-{index:05d}.jsonl"


def is_shard_complete(prefix: Path) -> bool:
    """A marker exists and the files it describes are there with the sizes it recorded."""
    marker = files.read_json_or_none(marker_path(prefix))
    if marker is None:
        return False
    return all(
        os.path.exists(f"{prefix}{ext}") and os.path.getsize(f"{prefix}{ext}") == marker[key]
        for ext, key in ((".bin", "bin_bytes"), (".idx", "idx_bytes"))
    )


def _batches(spans: list[Span], cfg: DictConfig) -> Iterator[list[Document | Reject]]:
    batch: list[Document | Reject] = []
    size = 0
    for span in spans:
        for item in read(span, cfg.data.text_key, cfg.data.max_document_bytes):
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


def tokenize_shard(cfg: DictConfig, index: int, spans: list[Span]) -> dict:
    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from tqdm import tqdm

    from pipeline.tokenizer import load, model_path

    layout = RunLayout.of(cfg.workdir)
    prefix = layout.shard_prefix(index)
    sp = load(model_path(cfg))
    eod = sp.eos_id()
    threads = max(1, int(cfg.cluster.cpus_per_task))
    partial = Path(f"{prefix}.partial")
    builder = IndexedDatasetBuilder(f"{partial}.bin", dtype=DType.optimal_dtype(sp.vocab_size()))
    stats: Counter = Counter()
    rejected: Counter = Counter()
    started = time.time()
    rejects_file = rejects_path(cfg, index)
    progress = tqdm(
        desc=f"shard {index}",
        unit=" docs",
        file=sys.stderr,
        mininterval=5,
        disable=None,
        dynamic_ncols=True,
    )
    with files.atomic_path(rejects_file) as rej_tmp, open(rej_tmp, "w") as rej_out:
        for batch in _prefetched(_batches(spans, cfg)):
            texts = [item.text for item in batch if isinstance(item, Document)]
            encoded = iter(sp.encode(texts, num_threads=threads))
            for item in batch:  # in input order, as preprocess_data.py writes them
                if isinstance(item, Document):
                    ids = next(encoded)
                    ids.append(eod)
                    builder.add_document(np.asarray(ids), [len(ids)])
                    stats["tokens"] += len(ids)
                    stats["bytes_in"] += item.source_bytes
                    continue
                if cfg.data.strict:
                    raise BadRecord(f"{item.where()}: {item.reason} {item.detail}".strip())
                rejected[item.reason] += 1
                rej_out.write(json.dumps(item.__dict__) + "\n")
                if item.reason == "empty_text":
                    # preprocess_data.py writes an empty document (no sequence) for empty text
                    builder.end_document()
            stats["documents"] += len(texts)
            progress.update(len(texts))
            progress.set_postfix(tok_per_s=f"{stats['tokens'] / (time.time() - started):.3g}")
    progress.close()
    builder.finalize(f"{partial}.idx")
    for ext in (".bin", ".idx"):
        with open(f"{partial}{ext}", "rb+") as f:
            os.fsync(f.fileno())
        os.replace(f"{partial}{ext}", f"{prefix}{ext}")
    files.fsync_dir(prefix.parent)
    marker = {
        "shard": index,
        "spans": [[s.path, s.start, s.end] for s in spans],
        "documents": stats["documents"],
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
    }
    files.write_json(marker_path(prefix), marker)
    mb = stats["bytes_in"] / 1e6
    print(
        f"shard {index}: {stats['documents']} documents, {stats['tokens']} tokens, "
        f"{mb:.1f} MB in {marker['seconds']:.1f} s ({mb / max(marker['seconds'], 1e-9):.2f} MB/s), "
        f"{sum(rejected.values())} rejected",
        file=sys.stderr,
    )
    return marker


def run_task(cfg: DictConfig, index: int) -> dict:
    """Array task `index`: tokenize that shard unless it is already complete."""
    prefix = RunLayout.of(cfg.workdir).shard_prefix(index)
    if is_shard_complete(prefix):
        return files.read_json(marker_path(prefix))
    return tokenize_shard(cfg, index, plan(cfg)[index])
