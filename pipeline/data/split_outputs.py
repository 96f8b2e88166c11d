"""Where a tokenize task writes the documents it encodes: one indexed dataset per split of each
source (`SplitFiles`), or a single one (`OneFile`, an extra evaluation set). Each file is
written under a temporary name and published whole; beside a split's .bin/.idx, a .digests file
holds the digest of each sequence's text, in order (what data.dedup=exact compares).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypedDict

from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.indexed import ShardWriter
from pipeline.data.split_assignment import SPLITS, Splitter

SUFFIXES = (".bin", ".idx", ".digests")


class FileRecord(TypedDict):
    """What one published file holds (a shard marker keeps one per split of each source)."""

    prefix: str  # relative to the run folder
    documents: int  # sequences: documents with at least one token
    tokens: int
    bin_bytes: int
    idx_bytes: int
    bin_sha256: str
    idx_sha256: str


class OutputFile:
    """One indexed dataset being written. Documents are buffered and written together at
    `flush` (one write per batch); an empty document is written in its place in the order."""

    def __init__(self, prefix: Path, vocab_size: int, digests: bool) -> None:
        self.prefix = prefix
        self.partial = Path(f"{prefix}.partial")
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        self.writer = ShardWriter(f"{self.partial}.bin", vocab_size)
        self.digests = open(f"{self.partial}.digests", "wb") if digests else None  # noqa: SIM115
        self.pending: list[list[int]] = []
        self.documents = self.tokens = 0

    def add(self, ids: list[int], digest: bytes) -> None:
        self.pending.append(ids)
        if self.digests is not None:
            self.digests.write(digest)

    def end_document(self, eod: int) -> None:
        """An empty document (no sequence), as preprocess_data.py writes for one."""
        self.flush(eod)
        self.writer.end_document()

    def flush(self, eod: int) -> None:
        if self.pending:
            self.tokens += self.writer.add_documents(self.pending, eod)
            self.documents += len(self.pending)
            self.pending.clear()

    def publish(self, root: Path) -> FileRecord:
        self.writer.finalize(f"{self.partial}.idx")
        suffixes = (".bin", ".idx")
        if self.digests is not None:
            self.digests.close()
            suffixes += (".digests",)
        files.publish(self.partial, self.prefix, suffixes)
        bin_path, idx_path = f"{self.prefix}.bin", f"{self.prefix}.idx"
        return {
            "prefix": str(self.prefix.relative_to(root)),
            "documents": self.documents,
            "tokens": self.tokens,
            "bin_bytes": os.path.getsize(bin_path),
            "idx_bytes": os.path.getsize(idx_path),
            "bin_sha256": files.sha256(bin_path),
            "idx_sha256": files.sha256(idx_path),
        }

    def remove_partial(self) -> None:
        for suffix in SUFFIXES:
            Path(f"{self.partial}{suffix}").unlink(missing_ok=True)


class SplitFiles:
    """Shard `index`'s files: for each of its sources, one per split. A document goes to the
    split its digest decides (pipeline.data.split_assignment)."""

    def __init__(
        self, paths: RunPaths, index: int, sources: list[str], vocab_size: int, splitter: Splitter
    ) -> None:
        self.root, self.splitter = paths.root, splitter
        self.files = {
            (source, split): OutputFile(paths.shard_prefix(index, split, source), vocab_size, True)
            for source in sources
            for split in SPLITS
        }

    def route(self, source: str | None, digest: bytes) -> OutputFile:
        return self.files[(source, SPLITS[self.splitter.index(digest)])]

    def flush(self, eod: int) -> None:
        for out in self.files.values():
            out.flush(eod)

    def publish(self) -> dict[str, dict[str, FileRecord]]:
        """Source -> split -> what its file holds."""
        published: dict[str, dict[str, FileRecord]] = {}
        for (source, split), out in self.files.items():
            published.setdefault(source, {})[split] = out.publish(self.root)
        return published

    def remove_partial(self) -> None:
        for out in self.files.values():
            out.remove_partial()


class OneFile:
    """Every document into one file, whatever its source or split (an extra evaluation set)."""

    def __init__(self, prefix: Path, vocab_size: int) -> None:
        self.out = OutputFile(prefix, vocab_size, digests=False)

    def route(self, source: str | None, digest: bytes) -> OutputFile:
        return self.out

    def flush(self, eod: int) -> None:
        self.out.flush(eod)

    def publish(self, root: Path) -> FileRecord:
        return self.out.publish(root)

    def remove_partial(self) -> None:
        self.out.remove_partial()
