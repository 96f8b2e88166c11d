"""Tokenize throughput by input format: the same documents as JSONL, JSONL.gz, JSONL.zst,
Parquet and a saved `datasets` Arrow file, through the tokenize stage's reading and encoding
(pipeline.data.tokenize.tokenize_spans, one encoding thread), beside sentencepiece alone on
the already-parsed texts.

Each measurement is a child process pinned to one core (taskset); the formats run side by side,
interleaved, --repeats times each, and the medians are printed. Tokens per second per core is
tokens / the child's CPU seconds (reading, parsing, encoding and writing included; importing
pyarrow, a fixed cost of each task, apart), which other work on a shared machine does not
inflate as it does wall time; wall time is printed too.

    python tools/bench_formats.py --mb 4 --model tokenizer.model --scratch /tmp/bench-formats
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MB = 1_000_000
FORMATS = ("jsonl", "gzip", "zstd", "parquet", "arrow")


def write_inputs(scratch: Path, megabytes: float) -> dict[str, Path]:
    """The built-in corpus's documents, up to `megabytes` of text, in every format."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from pipeline.data import corpus

    texts, size = [], 0
    every = list(corpus.documents())
    while size < megabytes * MB:  # the corpus again, when it is smaller than asked for
        for text in every:
            texts.append(text)
            size += len(text.encode())
            if size >= megabytes * MB:
                break
    jsonl = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts).encode()
    paths = {f: scratch / f"corpus.{f}" for f in FORMATS}
    paths["jsonl"].write_bytes(jsonl)
    paths["gzip"].write_bytes(gzip.compress(jsonl, 6))
    paths["zstd"].write_bytes(zstandard.ZstdCompressor(level=3).compress(jsonl))
    table = pa.table({"text": texts})
    pq.write_table(table, paths["parquet"], row_group_size=1000)  # snappy, as FineWeb's
    with pa.OSFile(str(paths["arrow"]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=1000)
    return paths


def child(kind: str, path: Path, model: Path, out: Path) -> None:
    """One measurement, printed as JSON: tokens, CPU and wall seconds."""
    from pipeline.config import DataConfig
    from pipeline.data.records import Document, Span, read
    from pipeline.data.tokenize import tokenize_spans
    from pipeline.data.tokenizer import load

    sp = load(model)
    data = DataConfig(inputs=[str(path)])
    started = time.process_time()
    import pyarrow.parquet  # noqa: F401 (a fixed cost of a task, not of its throughput)
    import zstandard  # noqa: F401

    imports = time.process_time() - started
    if kind == "raw":  # sentencepiece alone, on the texts parsed beforehand, in 1 MB batches
        texts = [d.text for d in read(Span(str(path)), "text", 1 << 30) if isinstance(d, Document)]
        batches, batch, size = [], [], 0
        for text in texts:
            batch.append(text)
            size += len(text)
            if size >= 1 << 20:
                batches.append(batch)
                batch, size = [], 0
        batches.append(batch)
        cpu, wall = time.process_time(), time.time()
        tokens = sum(len(ids) + 1 for b in batches for ids in sp.encode(b, num_threads=1))
    else:
        cpu, wall = time.process_time(), time.time()
        stats, _ = tokenize_spans(
            data, 1, [Span(str(path))], sp, out, out.with_suffix(".rej"), kind
        )
        tokens = stats["tokens"]
    cpu, wall = time.process_time() - cpu, time.time() - wall
    print(json.dumps({"tokens": tokens, "cpu": cpu, "wall": wall, "imports": imports}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mb", type=float, default=4, help="megabytes of text")
    p.add_argument("--model", type=Path, help="a sentencepiece model (required)")
    p.add_argument("--scratch", type=Path, default=Path("/tmp/bench-formats"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--core", type=int, default=0, help="the core each child is pinned to")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, path, model, out = args.child
        child(kind, Path(path), Path(model), Path(out))
        return
    if args.model is None:
        p.error("--model is required")
    args.scratch.mkdir(parents=True, exist_ok=True)
    paths = write_inputs(args.scratch, args.mb)
    runs: dict[str, list[dict]] = {k: [] for k in ("raw", *FORMATS)}
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        for kind in runs:
            path = paths["jsonl" if kind == "raw" else kind]
            command = ["taskset", "-c", str(args.core), sys.executable, __file__, "--child", kind,
                       str(path), str(args.model), str(args.scratch / f"out-{kind}")]  # fmt: skip
            runs[kind].append(json.loads(subprocess.check_output(command).splitlines()[-1]))
    load_after = os.getloadavg()
    base = statistics.median(r["tokens"] / r["cpu"] for r in runs["jsonl"])
    text_mb = paths["jsonl"].stat().st_size / MB
    print(f"text: {text_mb:.1f} MB of JSONL, the built-in corpus; model {args.model}")
    print(f"{args.repeats} runs of each, interleaved, each child pinned to core {args.core}")
    imports = statistics.median(r["imports"] for rs in runs.values() for r in rs)
    print(
        f"importing pyarrow and zstandard, once per task and not in the rates: {imports:.2f} CPU s"
    )
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")  # fmt: skip
    print("| input | file MB | tokens | tokens/s per core (CPU time) | vs JSONL | wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind, measured in runs.items():
        rate = statistics.median(r["tokens"] / r["cpu"] for r in measured)
        wall = statistics.median(r["wall"] for r in measured)
        size = paths["jsonl" if kind == "raw" else kind].stat().st_size / MB
        name = "sentencepiece alone (parsed text)" if kind == "raw" else kind
        print(f"| {name} | {size:.1f} | {measured[0]['tokens']:,} | {rate:,.0f} | "
              f"{rate / base:.2f} | {wall:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
