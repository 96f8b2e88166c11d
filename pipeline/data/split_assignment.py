"""Which split (train, validation, test) each document belongs to: decided by the document
alone, from a seeded hash of its text, with the weights of data.split. The same documents are
held out whatever data.num_shards, the order of the files or how they are cut into byte ranges,
and copies of one text always fall in the same split.
"""

from __future__ import annotations

import bisect
import hashlib

from pipeline.config.split_weights import Split

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
