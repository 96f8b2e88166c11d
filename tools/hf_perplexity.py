"""The exported model's perplexity, measured with transformers on the run's test split, beside
the pipeline's own evaluation of the same checkpoint (eval/DONE.json).

    python tools/hf_perplexity.py --workdir runs/gpt-1.3b [--model DIR] [--dtype fp32|bf16|fp16]

The windows are the evaluation's: each source's test documents laid end to end (end-of-document
tokens between them) and cut into model.seq_length windows, every token scored once; a mixture
gives each source and the mixture (the sources' losses weighted as training samples them), as
the evaluation does. Prints one JSON object with every set's losses, perplexities and their
relative difference; exits 1 when a perplexity differs by more than --tolerance, when a set's
token count differs, or when the export holds another checkpoint than the evaluation; 2, in one
line, when the run has no evaluation or no export to compare.

The default tolerance is what the export's dtype allows: 1e-5 in fp32 (float precision over a
sum of many token losses), and one unit roundoff of bf16 (2^-8) or fp16 (2^-11), whose rounding
of every logit averages out over the tokens of a perplexity.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
TOLERANCE = {"fp32": 1e-5, "bf16": 2.0**-8, "fp16": 2.0**-11}


def score(model, windows, device: str, batch: int) -> tuple[float, int]:
    """Summed token loss and token count of transformers' `model` over the evaluation's windows."""
    import torch

    total, tokens = 0.0, 0
    with torch.no_grad():
        for first in range(0, windows.windows, batch):
            part = [windows[k] for k in range(first, min(first + batch, windows.windows))]
            ids = torch.stack([b["tokens"] for b in part]).to(device)
            labels = torch.stack([b["labels"] for b in part]).to(device)
            mask = torch.stack([b["loss_mask"] for b in part]).to(device).flatten()
            logits = model(input_ids=ids).logits.float()
            losses = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), reduction="none"
            )
            total += float((losses.double() * mask).sum())
            tokens += int(mask.sum())
    return total, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--model", type=Path, help="the exported folder (default WORKDIR/export)")
    parser.add_argument("--dtype", choices=DTYPES, help="default: the export's own (export.dtype)")
    parser.add_argument(
        "--device", default="auto", help="auto (cuda where there is one), cpu, cuda"
    )
    parser.add_argument("--batch", type=int, default=8, help="windows per forward pass")
    parser.add_argument("--tolerance", type=float, help="relative; default: what --dtype allows")
    args = parser.parse_args()

    import torch

    from pipeline import config
    from pipeline.core import files
    from pipeline.core.paths import RunPaths
    from pipeline.data import evalsets
    from pipeline.evaluation.evaluate import perplexity

    paths = RunPaths.of(args.workdir)
    folder = args.model or paths.export_dir
    for needed, what in ((paths.eval_done, "evaluation"), (folder / "export.json", "export")):
        if not needed.is_file():
            print(
                f"error: {needed} does not exist: the run has no {what} to compare", file=sys.stderr
            )
            return 2
    evaluated = files.read_json(paths.eval_done)
    exported = files.read_json(folder / "export.json")
    if Path(exported["checkpoint"]).name != Path(evaluated["checkpoint"]).name:
        print(
            f"error: the export holds {exported['checkpoint']}, the evaluation measured "
            f"{evaluated['checkpoint']}",
            file=sys.stderr,
        )
        return 1
    dtype_name = args.dtype or exported.get("dtype", "bf16")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tolerance = TOLERANCE[dtype_name] if args.tolerance is None else args.tolerance

    import transformers

    cfg = config.read(paths.train_config)  # the settings the checkpoint was trained with
    manifest = files.read_json(paths.manifest)
    tests = evalsets.test_sets(cfg, manifest, 1)
    dtype = getattr(torch, DTYPES[dtype_name])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = model.to(device).eval()

    started = time.perf_counter()
    measured: dict[str, tuple[float, int]] = {}
    for test in tests:
        total, tokens = score(model, test.windows, device, args.batch)
        measured[test.name] = (total / max(tokens, 1), tokens)
    if len(tests) > 1:  # the mixture, as the evaluation weighs it
        by_source = {name.removeprefix("test/"): loss for name, (loss, _) in measured.items()}
        tokens = sum(t for _, t in measured.values())
        measured = {"test": (evalsets.mixture_loss(by_source, cfg), tokens), **measured}

    sets, ok = {}, True
    for name, (loss, tokens) in measured.items():
        ours = evaluated["sets"][name]
        theirs_ppl, ours_ppl = perplexity(loss), perplexity(ours["loss"])
        same = theirs_ppl == ours_ppl  # both infinite, say
        difference = 0.0 if same else (theirs_ppl - ours_ppl) / ours_ppl
        ok &= abs(difference) <= tolerance and tokens == ours["tokens"]
        sets[name] = {
            "pipeline_loss": ours["loss"],
            "pipeline_ppl": ours_ppl,
            "pipeline_tokens": ours["tokens"],
            "transformers_loss": loss,
            "transformers_ppl": theirs_ppl,
            "transformers_tokens": tokens,
            "ppl_relative_difference": difference,
        }
    report = {
        "checkpoint": Path(evaluated["checkpoint"]).name,
        "sets": sets,
        "dtype": dtype_name,
        "device": device,
        "tolerance": tolerance,
        "within_tolerance": ok,
        "seconds": round(time.perf_counter() - started, 2),
    }
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
