"""Train a sentencepiece tokenizer on JSONL / JSONL.gz files, outside any run:

    python tools/train_tokenizer.py --inputs '/data/*.jsonl.gz' --out spm32k --vocab-size 32000

Same trainer and defaults as the pipeline's tokenizer step (lossless, seeded reservoir sample);
use the result in runs with `tokenizer.model=spm32k.model`.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import TokenizerConfig  # noqa: E402
from pipeline.core import files  # noqa: E402
from pipeline.data import tokenizer  # noqa: E402
from pipeline.data.records import Document, Span, read  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", nargs="+", required=True, help="JSONL / JSONL.gz globs")
    parser.add_argument("--out", required=True, help="output prefix: writes PREFIX.model, .vocab")
    parser.add_argument("--text-key", default="text")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--type", choices=["bpe", "unigram"], default="bpe")
    parser.add_argument("--sample-documents", type=int, default=2_000_000)
    parser.add_argument("--character-coverage", type=float, default=0.9995)
    parser.add_argument("--no-byte-fallback", action="store_true")
    parser.add_argument(
        "--lossy", action="store_true", help="sentencepiece's default normalization"
    )
    parser.add_argument("--user-defined-symbols", nargs="*", default=["\n"])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    paths = sorted({p for pattern in args.inputs for p in glob.glob(pattern)})
    if not paths:
        sys.exit(f"error: --inputs {args.inputs} match no file")
    tk = TokenizerConfig(
        type=args.type,
        vocab_size=args.vocab_size,
        sample_documents=args.sample_documents,
        character_coverage=args.character_coverage,
        byte_fallback=not args.no_byte_fallback,
        lossless=not args.lossy,
        user_defined_symbols=args.user_defined_symbols,
        seed=args.seed,
        threads=args.threads,
    )
    docs = (
        item.text
        for p in paths
        for item in read(Span(p), args.text_key, 64 << 20)
        if isinstance(item, Document)
    )
    sample = tokenizer.sample_documents(docs, tk.sample_documents, tk.seed)
    if not sample:
        sys.exit("error: no valid document in the inputs")
    model = Path(f"{args.out}.model")
    with files.atomic_path(model) as tmp:
        tmp.write_bytes(tokenizer.train_model(sample, tk))
    sp = tokenizer.write_vocab(model)
    print(
        json.dumps(
            {
                "model": str(model),
                "vocab_size": sp.vocab_size(),
                "sample_documents": len(sample),
                "sha256": files.sha256(model),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
