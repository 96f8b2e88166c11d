"""Megatron's indexed dataset format (.bin/.idx), written and read without megatron-core.

Importing megatron-core (and so torch) costs seconds in every process; the tokenize tasks and
the verify step need only the file format. The bytes are those of megatron-core's
`IndexedDatasetBuilder` for one sequence per document; tests compare the two, and training
reads these files through megatron-core itself.

.idx layout: magic, version (u64 = 1), dtype code (u8), sequence count (u64), document-index
count (u64), then int32 sequence lengths, int64 byte pointers, int64 document indices.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
# megatron-core's DType codes for the token dtypes it picks (DType.optimal_dtype)
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}  # fmt: skip
_HEADER = struct.Struct("<QBQQ")  # version, dtype code, sequences, document indices
COPY_BLOCK = 1 << 24


class CorruptIndex(ValueError):
    """An .idx file that is not a whole Megatron index."""


@dataclass(frozen=True)
class Index:
    dtype: type
    sequence_lengths: np.ndarray  # int32, tokens per sequence
    sequence_pointers: np.ndarray  # int64, byte offset of each sequence in the .bin
    document_indices: np.ndarray  # int64, sequence index ending each document, from 0


def read_index(idx_path: str) -> Index:
    """Parse an .idx file, refusing a wrong magic, an unknown dtype or a size that does not
    match its own counts (a truncated or foreign file)."""
    with open(idx_path, "rb") as f:
        raw = f.read()
    if raw[: len(MAGIC)] != MAGIC:
        raise CorruptIndex(f"{idx_path}: not a Megatron index (bad magic)")
    try:
        version, code, sequences, documents = _HEADER.unpack_from(raw, len(MAGIC))
    except struct.error:
        raise CorruptIndex(f"{idx_path}: truncated header") from None
    if version != 1 or code not in DTYPES:
        raise CorruptIndex(f"{idx_path}: version {version}, dtype code {code} not understood")
    start = len(MAGIC) + _HEADER.size
    if len(raw) != start + 4 * sequences + 8 * sequences + 8 * documents:
        raise CorruptIndex(f"{idx_path}: {len(raw)} bytes, which its counts do not explain")
    lengths = np.frombuffer(raw, np.int32, sequences, start)
    pointers = np.frombuffer(raw, np.int64, sequences, start + 4 * sequences)
    doc_index = np.frombuffer(raw, np.int64, documents, start + 12 * sequences)
    return Index(DTYPES[code], lengths, pointers, doc_index)


class ShardWriter:
    """Writes the .bin/.idx pair that megatron-core's IndexedDatasetBuilder writes for one
    sequence per document, byte for byte, in the dtype it would choose for the vocabulary."""

    def __init__(self, bin_path: str, vocab_size: int) -> None:
        # DType.optimal_dtype: uint16 (code 8) below 65500 pieces, else int32 (code 4)
        self.typecode, self.dtype_code = ("H", 8) if vocab_size < 65500 else ("i", 4)
        self.itemsize = array(self.typecode).itemsize
        self.bin = open(bin_path, "wb")  # noqa: SIM115 (closed by finalize)
        self.lengths = array("i")  # int32 tokens per sequence
        self.document_indices = array("q", [0])  # int64 sequence index ending each document
        assert self.lengths.itemsize == 4 and self.document_indices.itemsize == 8

    def add_documents(self, encoded: list, eod: int) -> int:
        """Append documents (lists of ids, or numpy arrays for long ones), eod-terminated, one
        sequence each; returns the tokens written."""
        tokens = array(self.typecode)
        written = 0
        for ids in encoded:
            if isinstance(ids, np.ndarray):  # a long document: written as it is, no copy
                self.bin.write(tokens)
                written += len(tokens)
                del tokens[:]
                self.bin.write(ids.astype(self.typecode, copy=False))
                tokens.append(eod)
                written += len(ids)
            else:
                tokens.fromlist(ids)
                tokens.append(eod)
            self.lengths.append(len(ids) + 1)
            self.document_indices.append(len(self.lengths))
        self.bin.write(tokens)
        return written + len(tokens)

    def end_document(self) -> None:
        """An empty document (no sequence), as preprocess_data.py writes for one."""
        self.document_indices.append(len(self.lengths))

    def finalize(self, idx_path: str) -> None:
        self.bin.close()
        lengths = np.frombuffer(self.lengths, dtype=np.int32)
        documents = np.frombuffer(self.document_indices, dtype=np.int64)
        write_index(idx_path, DTYPES[self.dtype_code], lengths, documents)


def write_index(idx_path: str, dtype: type, lengths: np.ndarray, document_indices: np.ndarray):
    """The .idx of sequences of `lengths` tokens laid end to end in the .bin."""
    code = next(c for c, t in DTYPES.items() if t is dtype)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    with open(idx_path, "wb") as f:
        f.write(MAGIC)
        f.write(_HEADER.pack(1, code, len(lengths), len(document_indices)))
        f.write(np.asarray(lengths, dtype=np.int32).tobytes())
        f.write((pointers * np.dtype(dtype).itemsize).tobytes())
        f.write(np.asarray(document_indices, dtype=np.int64).tobytes())


def copy_sequences(source: str, target: str, keep: np.ndarray | None = None) -> None:
    """Write TARGET.bin/.idx with the sequences of SOURCE whose `keep` is true (all if None),
    one document each, in order, as megatron-core's builder would write them."""
    index = read_index(f"{source}.idx")
    itemsize = np.dtype(index.dtype).itemsize
    kept = np.arange(len(index.sequence_lengths)) if keep is None else np.flatnonzero(keep)
    with open(f"{source}.bin", "rb") as src, open(f"{target}.bin", "wb") as out:
        for run in np.split(kept, np.flatnonzero(np.diff(kept) != 1) + 1):  # consecutive runs
            if not len(run):
                continue
            first, last = int(run[0]), int(run[-1])
            start = int(index.sequence_pointers[first])
            end = int(index.sequence_pointers[last]) + int(index.sequence_lengths[last]) * itemsize
            src.seek(start)
            while start < end:
                block = src.read(min(end - start, COPY_BLOCK))
                out.write(block)
                start += len(block)
    lengths = index.sequence_lengths[kept]
    write_index(f"{target}.idx", index.dtype, lengths, np.arange(len(lengths) + 1))


def concatenate(sources: list[str], target: str) -> None:
    """Write TARGET.bin/.idx holding the indexed datasets SOURCES one after another (what
    megatron-core's IndexedDatasetBuilder.add_index writes), without reading them into memory."""
    import shutil

    lengths, documents, dtype, count = [], [np.zeros(1, dtype=np.int64)], None, 0
    with open(f"{target}.bin", "wb") as out:
        for source in sources:
            index = read_index(f"{source}.idx")
            if dtype is not None and index.dtype is not dtype:
                raise ValueError(f"{source}: token type {index.dtype}, the others {dtype}")
            dtype = index.dtype
            documents.append(index.document_indices[1:] + count)
            lengths.append(index.sequence_lengths)
            count += len(index.sequence_lengths)
            with open(f"{source}.bin", "rb") as src:
                shutil.copyfileobj(src, out, COPY_BLOCK)
    write_index(f"{target}.idx", dtype, np.concatenate(lengths), np.concatenate(documents))
