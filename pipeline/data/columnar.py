"""Reading documents from Parquet and Arrow files (an Arrow IPC file or stream, as
`datasets.save_to_disk` writes): the text column of each row, in batches, never a whole file in
memory. A null or non-string value is a Reject naming the file and row; rows a source's `where`
leaves out are counted (Filtered); a damaged file or row group is one Reject naming it, after
the rows read before the damage, standing for the rows lost: the rest of a Parquet row group;
not known for a file that cannot be opened or an Arrow file cut short.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline.config import row_filter
from pipeline.core.errors import ConfigError
from pipeline.data.documents import Document, Filtered, Reject, Span, where_key

BATCH_ROWS = 1024
TEXT_TYPES = ("string", "large_string", "string_view")
BYTES_TYPES = ("binary", "large_binary", "binary_view")


def read(
    span: Span, kind: str, text_key: str, max_document_bytes: int, where: str | None
) -> Iterator[Document | Reject | Filtered]:
    import pyarrow as pa

    tree = row_filter.parse(where) if where else None
    wanted = [text_key, *(row_filter.columns(tree) if tree else [])]
    groups = _parquet_groups(span, wanted) if kind == "parquet" else _arrow_batches(span)
    row = 0
    try:
        for first_row, rows, batches in groups:
            row = first_row
            try:
                for batch in batches:
                    yield from _rows(span, batch, row, text_key, max_document_bytes, tree, where)
                    row += batch.num_rows
            except (pa.ArrowException, OSError) as e:
                if rows is None:
                    raise
                lost = max(1, first_row + rows - row)  # the rest of the row group
                yield Reject(span.path, row + 1, "damaged_parquet", _line(e), "row", lost)
    except (pa.ArrowException, OSError) as e:  # how many rows are lost cannot be told
        yield Reject(span.path, row + 1, f"damaged_{kind}", _line(e), "row", None)


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def _parquet_groups(span: Span, wanted: list[str]):
    """(first row, rows, its batches) for each row group of the span."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(span.path)
    meta = f.metadata
    present = [c for c in wanted if c in f.schema_arrow.names]
    last = meta.num_row_groups if span.end is None else span.end
    first_row = sum(meta.row_group(g).num_rows for g in range(span.start))
    for group in range(span.start, last):
        rows = meta.row_group(group).num_rows
        yield first_row, rows, f.iter_batches(BATCH_ROWS, row_groups=[group], columns=present)
        first_row += rows


def _arrow_batches(span: Span):
    import pyarrow as pa

    source = pa.memory_map(span.path)
    try:
        reader = pa.ipc.open_file(source)
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    except pa.ArrowInvalid:
        batches = iter(pa.ipc.open_stream(source))
    yield 0, None, batches  # the rows of a stream are not known ahead


def _rows(span: Span, batch, first_row: int, text_key: str, max_bytes: int, tree, where):
    """The documents and rejects of one record batch, rows counted from `first_row` (0-based)."""
    import pyarrow as pa

    rows = range(batch.num_rows)
    if tree is not None:
        missing = [c for c in row_filter.columns(tree) if c not in batch.schema.names]
        if missing:
            raise ConfigError(
                f"{where_key(span)}: {where!r} reads column {missing[0]!r}, which {span.path} "
                f"does not have (its columns: {', '.join(batch.schema.names)})"
            )
        try:
            keep = _mask(tree, batch).to_numpy(zero_copy_only=False)
        except pa.ArrowException as e:
            raise ConfigError(f"{where_key(span)}: {where!r} on {span.path}: {_line(e)}") from e
        rows = keep.nonzero()[0].tolist()
        if len(rows) < batch.num_rows:
            yield Filtered(span.path, batch.num_rows - len(rows))
    if text_key not in batch.schema.names:
        for i in rows:
            yield Reject(
                span.path, first_row + i + 1, "missing_text", f"no column {text_key!r}", "row"
            )
        return
    column = batch.column(text_key)
    type_name = str(column.type)
    if type_name not in TEXT_TYPES + BYTES_TYPES:
        values = [None if v is None else type_name for v in column.to_pylist()]
    else:
        values = column.to_pylist()
    for i in rows:
        value = values[i]
        where_ = first_row + i + 1
        if value is None:
            yield Reject(span.path, where_, "null_text", "", "row")
        elif type_name not in TEXT_TYPES + BYTES_TYPES:
            yield Reject(span.path, where_, "text_not_string", value, "row")
        else:
            yield _document(span.path, where_, value, max_bytes)


def _document(path: str, row: int, value: str | bytes, max_bytes: int) -> Document | Reject:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as e:
            return Reject(path, row, "invalid_utf8", str(e), "row")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return Reject(path, row, "too_large", f"> {max_bytes} bytes", "row")
    if not value:
        return Reject(path, row, "empty_text", "", "row")
    return Document(value, size)


def _mask(tree: row_filter.Filter, batch):
    """A boolean pyarrow array: the rows of `batch` the filter keeps (a null: left out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def evaluate(node: row_filter.Filter):
        if isinstance(node, row_filter.Compare):
            return getattr(pc, row_filter.OPS[node.op])(
                batch.column(node.column), pa.scalar(node.value)
            )
        combine = pc.and_kleene if node.op == "and" else pc.or_kleene
        return combine(evaluate(node.left), evaluate(node.right))

    return pc.fill_null(evaluate(tree), False)
