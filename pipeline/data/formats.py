"""What an input file holds, told by its first bytes whatever its name says, and the units the
shard plan may cut it into.

Kinds: gzip, zstd (JSONL or text inside), parquet, arrow (an Arrow IPC file or stream, as
`datasets.save_to_disk` writes), or plain (JSONL, or text where a source says format: text).
A Parquet file is cut by row groups, a zstd stream by its frames, a plain JSONL file by byte
ranges (pipeline.data.shards); anything else goes whole to one shard.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
from typing import BinaryIO

GZIP, ZSTD, PARQUET = b"\x1f\x8b", b"\x28\xb5\x2f\xfd", b"PAR1"
ARROW_FILE, ARROW_STREAM = b"ARROW1", b"\xff\xff\xff\xff"  # the stream's continuation marker
COLUMNAR = ("parquet", "arrow")
READ_CHUNK = 1 << 20
FEED = 1 << 14  # compressed bytes given to a zstd decompressor at a time


@functools.lru_cache(maxsize=65536)
def kind(path: str) -> str:
    """gzip | zstd | parquet | arrow | plain, by the file's first bytes."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(GZIP):
        return "gzip"
    if head.startswith(ZSTD):
        return "zstd"
    if head.startswith(PARQUET):
        return "parquet"
    if head.startswith((ARROW_FILE, ARROW_STREAM)):
        return "arrow"
    return "plain"


NAMED = {".gz": "gzip", ".zst": "zstd", ".parquet": "parquet", ".arrow": "arrow"}


def misnamed(path: str) -> str | None:
    """A warning for a file whose name says another kind than its content, or None."""
    named = next((k for ext, k in NAMED.items() if path.endswith(ext)), "plain")
    actual = kind(path)
    if named == actual:
        return None
    words = {"plain": "plain text", "gzip": "gzip-compressed", "zstd": "zstd-compressed"}
    said = words.get(actual, actual)
    return f"{path} is {said}, whatever its name says: read as {said}"


def units(path: str, size: int) -> list[tuple[int, int | None, int]] | None:
    """The parts of a file the plan may give to different shards, as (start, end, bytes):
    Parquet row groups (start, end: group indices), zstd frames (byte offsets); None for a
    plain file (cut anywhere, at line starts). A damaged file is one unit: its reader says
    what is wrong with it."""
    found = kind(path)
    if found == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(path).metadata
        except (pa.ArrowException, OSError):
            return [(0, None, size)]
        groups = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]
        return [(g, g + 1, n) for g, n in enumerate(groups)] or [(0, None, size)]
    if found == "zstd":
        frames = zstd_frames(path)
        return [(start, end, end - start) for start, end in frames] or [(0, None, size)]
    return None


def zstd_frames(path: str) -> list[tuple[int, int]]:
    """(start, end) byte offsets of each zstd frame, read from the frame and block headers
    without decompressing; a frame cut short ends at the end of the file."""
    import zstandard

    frames: list[tuple[int, int]] = []
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        start = 0
        while start < size:
            f.seek(start)
            head = f.read(18)
            if head[:4] != ZSTD:
                if len(head) >= 8 and head[:4][1:] == b"\x2a\x4d\x18":  # a skippable frame
                    start += 8 + int.from_bytes(head[4:8], "little")
                    continue
                if frames:  # what follows is no frame: the reader of the last says so
                    frames[-1] = (frames[-1][0], size)
                break
            try:
                params = zstandard.get_frame_parameters(head)
                position = start + zstandard.frame_header_size(head)
            except zstandard.ZstdError:
                frames.append((start, size))
                break
            while True:
                f.seek(position)
                block = f.read(3)
                if len(block) < 3:
                    position = size
                    break
                header = int.from_bytes(block, "little")
                last, block_type, block_size = header & 1, (header >> 1) & 3, header >> 3
                position += 3 + (1 if block_type == 1 else block_size)
                if last:
                    position += 4 if params.has_checksum else 0
                    break
            end = min(position, size)
            frames.append((start, end))
            start = end
    return frames


def zstandard():
    import zstandard

    return zstandard


class ZstdReader(io.RawIOBase):
    """The decompressed bytes of a file's zstd frames from byte `start` on, one frame after
    another. `boundary` becomes the decompressed offset at which the frames before byte `end`
    stop; with `run_on`, reading goes on past it (a line starting before it is the span's, and
    may end in the next frame). EOFError where the data ends inside a frame (a truncated
    stream), after all that came before it; past `end`, `cut_short` says so instead, as the
    next span's reader reports it."""

    def __init__(self, path: str, start: int = 0, end: int | None = None, run_on: bool = True):
        super().__init__()
        self.raw = open(path, "rb")  # noqa: SIM115 (closed with this reader)
        self.raw.seek(start)
        self.before_end = (end if end is not None else os.path.getsize(path)) - start
        self.run_on = run_on
        self.boundary: int | None = None
        self.cut_short = False
        self.failed: EOFError | None = None
        self.produced = 0
        self.context = zstandard().ZstdDecompressor()
        self.frame = None
        self.out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        zstd = zstandard()
        while not self.out:
            if self.failed is not None:  # after the bytes decompressed before the damage
                raise self.failed
            past_end = self.boundary is not None
            if past_end and not self.run_on:
                return 0
            want = READ_CHUNK if past_end else min(READ_CHUNK, self.before_end)
            chunk = self.raw.read(want) if want > 0 else b""
            if not chunk:
                inside = self.frame is not None and not self.frame.eof
                if past_end:
                    self.cut_short = inside
                    return 0
                if inside:
                    raise EOFError("the zstd stream ends inside a frame (a truncated file)")
                self.boundary = self.produced
                continue
            if not past_end:
                self.before_end -= len(chunk)
            pieces, view, at = [], memoryview(chunk), 0
            while at < len(view):
                if self.frame is None or self.frame.eof:
                    self.frame = self.context.decompressobj()
                piece = view[at : at + FEED]  # a failed piece loses its output: keep them small
                try:
                    pieces.append(self.frame.decompress(piece))
                except zstd.ZstdError as e:
                    self.failed = EOFError(f"damaged zstd data: {e}")
                    break
                at += len(piece) - (len(self.frame.unused_data) if self.frame.eof else 0)
            self.out = memoryview(b"".join(pieces))
            self.produced += len(self.out)
        n = min(len(buffer), len(self.out))
        buffer[:n] = self.out[:n]
        self.out = self.out[n:]
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_bytes(path: str, start: int = 0, end: int | None = None) -> BinaryIO:
    """The content of a gzip, zstd or plain file (zstd: the frames in [start, end))."""
    import gzip

    found = kind(path)
    if found == "gzip":
        return gzip.open(path, "rb")
    if found == "zstd":
        return io.BufferedReader(ZstdReader(path, start, end), READ_CHUNK)
    return open(path, "rb")  # noqa: SIM115 (the caller closes it)


PROBE, FINE = 1 << 16, 256  # compressed bytes fed at a time when finding a stream's damage


def lost_bytes(path: str, start: int = 0, end: int | None = None) -> tuple[int, int | None]:
    """For a gzip or zstd stream whose reader failed: (decompressed bytes before the damage in
    the compressed bytes [start, end), decompressed bytes predicted lost after it). Damage in
    the middle loses the compressed bytes after it at the ratio of those before; a stream cut
    short loses what its zstd frame header says the frame held, and None where no header says
    (gzip records its length only in its last bytes). Found by decompressing the range again,
    in pieces (a decompressor fails a whole piece), and once more in small pieces near the
    damage, so only for a stream known to be damaged."""
    end = os.path.getsize(path) if end is None else end
    found = _decode(path, start, end, None)
    if found.damaged_at is not None:
        found = _decode(path, start, end, found.damaged_at)
    if found.damaged_at is not None:  # what followed the last output is lost, at its ratio
        before = found.output_end - start
        if not (before and found.decoded):
            return found.decoded, None
        return found.decoded, round((end - found.output_end) * found.decoded / before)
    if found.frame_start is None:  # every frame whole
        return found.decoded, 0
    size = content_size(path, found.frame_start) if kind(path) == "zstd" else None
    return found.decoded, None if size is None else max(0, size - found.frame_decoded)


@dataclasses.dataclass
class _Decoded:
    decoded: int = 0  # decompressed bytes before the damage
    damaged_at: int | None = None  # the compressed offset of the piece that failed
    output_end: int = 0  # the compressed offset where the last output came (a block ended)
    frame_start: int | None = None  # of the frame (gzip member) the data ended inside
    frame_decoded: int = 0  # of that frame


def _decode(path: str, start: int, end: int, fine_from: int | None) -> _Decoded:
    """Decompress [start, end) in pieces, small ones from `fine_from` on, until damage."""
    import zlib

    zstd = kind(path) == "zstd"
    errors = (zstandard().ZstdError,) if zstd else (zlib.error,)
    result = _Decoded(output_end=start)
    decoder, offset, data = None, start, b""
    with open(path, "rb") as f:
        while True:
            if not data:
                want = PROBE if fine_from is None or offset < fine_from - PROBE else FINE
                data = (
                    os.pread(f.fileno(), min(want, end - offset), offset) if offset < end else b""
                )
                if not data:
                    break
            if decoder is None or decoder.eof:
                decoder = (
                    zstandard().ZstdDecompressor().decompressobj()
                    if zstd
                    else zlib.decompressobj(wbits=31)
                )
                result.frame_start, result.frame_decoded = offset, 0
            try:
                out = decoder.decompress(data)
            except errors:
                result.damaged_at = offset
                return result
            result.decoded += len(out)
            result.frame_decoded += len(out)
            rest = decoder.unused_data if decoder.eof else b""
            offset += len(data) - len(rest)
            data = rest
            if out:
                result.output_end = offset
    if decoder is None or decoder.eof:
        result.frame_start = None
    return result


def decoded_head(path: str, compressed: int) -> int:
    """The decompressed bytes of a gzip or zstd file's first `compressed` bytes."""
    return _decode(path, 0, compressed, None).decoded


def content_size(path: str, frame_start: int) -> int | None:
    """The decompressed size a zstd frame's header records, or None where it records none."""
    with open(path, "rb") as f:
        head = os.pread(f.fileno(), 18, frame_start)
    try:
        size = zstandard().get_frame_parameters(head).content_size
    except zstandard().ZstdError:
        return None
    return None if size >= zstandard().CONTENTSIZE_ERROR else size


zstd_frames_cached = functools.lru_cache(maxsize=64)(zstd_frames)  # read by each span's reader
