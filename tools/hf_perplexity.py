"""The exported model's perplexity, measured with transformers on the run's test split, beside
the pipeline's own evaluation of the same checkpoint (eval/DONE.json).

    python tools/hf_perplexity.py --workdir runs/gpt-1.3b [--model DIR] [--dtype bf16]

The windows are the evaluation's: the test documents laid end to end (end-of-document tokens
between them) and cut into model.seq_length windows, every token scored once. Prints both
losses and perplexities and their relative difference; exits 1 when the perplexities differ by
more than --tolerance (1%), or when the export holds another checkpoint than the evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--model", type=Path, help="the exported folder (default WORKDIR/export)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=8, help="windows per forward pass")
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args()

    import torch
    import transformers

    from pipeline import config
    from pipeline.core import files
    from pipeline.core.paths import RunPaths
    from pipeline.data import evalsets

    paths = RunPaths.of(args.workdir)
    folder = args.model or paths.export_dir
    cfg = config.read(paths.train_config)  # the settings the checkpoint was trained with
    evaluated = files.read_json(paths.eval_done)
    exported = files.read_json(folder / "export.json")
    if Path(exported["checkpoint"]).name != Path(evaluated["checkpoint"]).name:
        print(
            f"the export holds {exported['checkpoint']}, the evaluation measured "
            f"{evaluated['checkpoint']}",
            file=sys.stderr,
        )
        return 1
    manifest = files.read_json(paths.manifest)
    [test] = evalsets.test_sets(cfg, manifest, 1)  # a corpus of one source
    dtype = getattr(torch, DTYPES[args.dtype])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = model.to(args.device).eval()

    started = time.perf_counter()
    total, tokens = 0.0, 0
    windows = test.windows
    with torch.no_grad():
        for first in range(0, windows.windows, args.batch):
            batch = [windows[k] for k in range(first, min(first + args.batch, windows.windows))]
            ids = torch.stack([b["tokens"] for b in batch]).to(args.device)
            labels = torch.stack([b["labels"] for b in batch]).to(args.device)
            mask = torch.stack([b["loss_mask"] for b in batch]).to(args.device)
            logits = model(input_ids=ids).logits.float()
            losses = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), reduction="none"
            )
            total += float((losses * mask.flatten()).sum())
            tokens += int(mask.sum())
    seconds = time.perf_counter() - started
    loss = total / tokens
    ours, theirs = math.exp(evaluated["test_loss"]), math.exp(loss)
    difference = (theirs - ours) / ours
    print(
        json.dumps(
            {
                "checkpoint": Path(evaluated["checkpoint"]).name,
                "pipeline_test_loss": evaluated["test_loss"],
                "pipeline_test_ppl": ours,
                "pipeline_test_tokens": evaluated["test_tokens"],
                "transformers_test_loss": loss,
                "transformers_test_ppl": theirs,
                "transformers_test_tokens": tokens,
                "ppl_relative_difference": difference,
                "dtype": args.dtype,
                "device": args.device,
                "seconds": round(seconds, 2),
            },
            indent=2,
        )
    )
    return 0 if abs(difference) <= args.tolerance and tokens == evaluated["test_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
