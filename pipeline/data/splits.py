"""Which split (train, validation, test) each document belongs to: decided by the document
alone, from a seeded hash of its text, with the weights of data.split. The same documents are
held out whatever data.num_shards, the order of the files or how they are cut into byte ranges,
and copies of one text always fall in the same split.
"""

from __future__ import annotations

import bisect
import hashlib

from pipeline.config.split import Split
from pipeline.core.errors import ConfigError
from pipeline.data.documents import source_where_key

SPLITS = ("train", "validation", "test")
DIGEST_BYTES = 16  # of a document's text: the key of exact deduplication


def digest(text: str) -> bytes:
    """A document's identity: equal texts, equal digests (and, at 128 bits, only those)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=DIGEST_BYTES).digest()


class Splitter:
    """Assigns a document, by its digest, to a split: a keyed hash of the digest read as a
    number in [0, 2**64) falls into one of three ranges sized by data.split."""

    def __init__(self, split: str, seed: int) -> None:
        train, validation, _ = Split.of(split).shares
        self.bounds = [round(2**64 * train), round(2**64 * (train + validation))]
        self.key = seed.to_bytes(16, "little", signed=True)

    def index(self, document_digest: bytes) -> int:
        """0, 1 or 2: the position of the document's split in SPLITS."""
        value = hashlib.blake2b(document_digest, digest_size=8, key=self.key).digest()
        return bisect.bisect_right(self.bounds, int.from_bytes(value, "little"))


def check_splits(manifest: dict, seq_length: int, needed: tuple[str, ...]) -> None:
    """Refuse a split that a stage reads but that is too small to give one sequence of every
    source: megatron-core would loop forever on an empty one, and a loss over a few tokens says
    nothing. Where a source's row filter left out most of its rows, the filter is named."""
    need = seq_length + 1
    many = len(manifest["sources"]) > 1
    for name, source in manifest["sources"].items():
        for split in needed:
            tokens = source["split_tokens"][split]
            if tokens >= need:
                continue
            of = f" of source {name}" if many else ""
            small = (
                f"the {split} split{of} has {tokens} tokens, fewer than one sequence of "
                f"model.seq_length+1={need}"
            )
            larger = (
                f"give {split} a larger share of data.split={manifest['split']!r} and tokenize "
                "again (force=tokenize: each document's split is decided when it is tokenized)"
            )
            filtered = source.get("filtered", 0)
            rows = filtered + source["documents"] + source["no_token_documents"]
            rows += sum(source["rejected"].values())
            if filtered and filtered >= rows / 2:
                raise ConfigError(
                    f"{source_where_key(name)}: left out {filtered:,} of the {rows:,} rows of "
                    f"source {name}, and {small}; loosen the filter, or {larger}"
                )
            raise ConfigError(f"data.split: {small}; {larger}, or give more data")
