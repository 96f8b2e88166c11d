"""Memory of one very long document through the tokenize stage's reading and encoding.

Writes one text file of --mb megabytes (real text: the built-in corpus's documents laid end to
end, then again, until the size is reached), tokenizes it as data.format=text with the
stage's own code (pipeline.data.tokenize.tokenize_spans) in a child process, and prints that
process's peak RSS, its time, and two checks:

  - the ids decode back to the text, byte for byte (nothing lost or doubled at the cuts);
  - on the first --whole-mb megabytes, cut as a document of its own, the ids equal
    sentencepiece's encoding of the whole text in one call (which needs ~65 bytes of memory a
    byte of text, so not at the full size on a small machine).

    python tools/bench_long_document.py --mb 300 --scratch /tmp/long
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 1_000_000


def write_document(out: Path, megabytes: float) -> int:
    from pipeline.data import corpus

    texts = list(corpus.documents())
    written = 0
    with open(out, "w", encoding="utf-8") as f:
        while written < megabytes * MB:
            for text in texts:
                f.write(text + "\n\n")
                written += len(text.encode()) + 2
                if written >= megabytes * MB:
                    break
    return written


def train(out: Path, vocab_size: int) -> Path:
    from pipeline.config import TokenizerConfig
    from pipeline.data import corpus
    from pipeline.data.tokenizer import train_model

    texts = list(itertools.islice(corpus.documents(), 3000))
    out.write_bytes(train_model(texts, TokenizerConfig(vocab_size=vocab_size, threads=2)))
    return out


def child(text_path: Path, model: Path, out: Path) -> None:
    """Tokenize one text file as one document; print what it took."""
    from pipeline.config import DataConfig
    from pipeline.data.records import Span
    from pipeline.data.tokenize import tokenize_spans
    from pipeline.data.tokenizer import load

    sp = load(model)
    data = DataConfig(inputs=[str(text_path)], format="text", max_document_bytes=1 << 40)
    started = time.time()
    stats, rejected = tokenize_spans(
        data, 1, [Span(str(text_path))], sp, out, out.with_suffix(".rejects"), "long"
    )
    seconds = time.time() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens": stats["tokens"], "seconds": seconds, "max_rss_mb": rss}))


def decodes_back(text_path: Path, prefix: Path, model: Path) -> bool:
    """The written ids decode to the file's text: decoded between newline pieces (each
    behind a newline id, so that no space is taken for sentencepiece's dummy prefix)."""
    import numpy as np

    from pipeline.data.indexed import read_index
    from pipeline.data.tokenizer import load

    sp = load(model)
    index = read_index(f"{prefix}.idx")
    ids = np.memmap(f"{prefix}.bin", dtype=index.dtype, mode="r")[
        : int(index.sequence_lengths[0]) - 1
    ]
    newline = sp.piece_to_id("\n")
    ends = np.flatnonzero(ids == newline) + 1
    with open(text_path, encoding="utf-8") as f:
        start = 0
        for end in list(ends[::4096]) + [len(ids)]:
            if end <= start:
                continue
            chunk = ids[start:end].tolist()
            decoded = sp.decode(chunk) if start == 0 else sp.decode([newline, *chunk])[1:]
            if f.read(len(decoded)) != decoded:
                return False
            start = end
        return f.read(1) == ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mb", type=float, default=300)
    p.add_argument("--whole-mb", type=float, default=20)
    p.add_argument("--scratch", type=Path, default=Path("/tmp/bench-long-document"))
    p.add_argument("--model", type=Path, help="sentencepiece model; default: train one")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--child", nargs=3, type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    args.scratch.mkdir(parents=True, exist_ok=True)
    model = args.model or train(args.scratch / "bench.model", args.vocab_size)
    text_path = args.scratch / "long.txt"
    size = write_document(text_path, args.mb)
    run = [sys.executable, __file__, "--child", str(text_path), str(model)]
    result = json.loads(
        subprocess.check_output([*run, str(args.scratch / "long")]).splitlines()[-1]
    )
    print(f"document: {size / MB:.1f} MB of text, one document; model {model}")
    print(
        f"tokenize: {result['tokens']:,} tokens in {result['seconds']:.1f} s, "
        f"peak RSS {result['max_rss_mb']:.0f} MB"
    )
    print(f"ids decode back to the text: {decodes_back(text_path, args.scratch / 'long', model)}")
    whole = args.scratch / "whole.txt"
    with open(text_path, encoding="utf-8") as f:
        whole.write_text(f.read(int(args.whole_mb * MB)))
    piecewise = subprocess.check_output(
        [sys.executable, "-c", EQUAL, str(whole), str(model)], cwd=ROOT, text=True
    )
    print(piecewise.strip())


EQUAL = """
import resource, sys
from pipeline.data.pieces import PieceEncoder
from pipeline.data.tokenizer import load
text = open(sys.argv[1], encoding="utf-8").read()
sp = load(sys.argv[2])
pieces = PieceEncoder(sp).encode_long(text).tolist()
whole = sp.encode(text)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"first {len(text.encode()) / 1e6:.1f} MB: ids in pieces == whole-text ids: "
      f"{pieces == whole} ({len(whole):,} ids; whole-text encoding's process peaked at {rss:.0f} MB)")
"""


if __name__ == "__main__":
    main()
