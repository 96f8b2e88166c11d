"""The evaluation stage: loss and perplexity of a checkpoint (the best, by default) on the
held-out test split."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from pipeline import checkpoint, data, files, report
from pipeline.layout import RunLayout


def resolve_checkpoint(cfg: DictConfig) -> Path:
    root = RunLayout.of(cfg.workdir).checkpoints
    choice = str(cfg.eval.checkpoint)
    folder = {"best": checkpoint.best, "latest": checkpoint.latest}.get(
        choice, lambda _: Path(choice)
    )(root)
    if folder is None or not checkpoint.is_valid(folder):
        raise FileNotFoundError(f"eval.checkpoint={choice}: no valid checkpoint under {root}")
    return folder


def _samples(cfg: DictConfig, engine, tokenizer_model: Path) -> list[dict]:
    """Greedy and sampled continuations of the configured prompts (single-stage models)."""
    from pipeline.generate import continue_text
    from pipeline.tokenizer import load

    if len(engine.chunks) > 1 or cfg.parallel.pipeline > 1 or cfg.parallel.tensor > 1:
        return []  # pipeline- and tensor-parallel layouts sample through a single-GPU evaluation
    sp, e = load(tokenizer_model), cfg.eval
    out = []
    for prompt in e.prompts:
        common = dict(
            max_new_tokens=e.max_new_tokens, seq_length=cfg.model.seq_length, device=engine.device
        )
        out.append(
            {
                "prompt": prompt,
                "greedy": continue_text(engine.chunks[0], sp, prompt, **common),
                "sampled": continue_text(
                    engine.chunks[0],
                    sp,
                    prompt,
                    top_k=e.top_k,
                    top_p=e.top_p,
                    seed=cfg.train.seed,
                    **common,
                ),
            }
        )
    return out


def is_complete(cfg: DictConfig) -> bool:
    """The results and the report: a job killed between the two writes the report again."""
    layout = RunLayout.of(cfg.workdir)
    return layout.eval_done.exists() and layout.report.exists()


def run(cfg: DictConfig) -> dict:
    from pipeline.engine import Engine

    layout = RunLayout.of(cfg.workdir)
    if layout.eval_done.exists():
        if not layout.report.exists():
            report.write_report(layout)
        return files.read_json(layout.eval_done)
    started = time.time()
    manifest = data.load_manifest(cfg)
    folder = resolve_checkpoint(cfg)
    engine = Engine(cfg, manifest["vocab_size"])
    step = checkpoint.load(folder, engine.backend, engine.chunks, None)["step"]
    test = data.test_dataset(cfg, manifest)
    mbs = cfg.eval.micro_batch_size or cfg.train.micro_batch_size
    loss, tokens = engine.loss_over(test, mbs, cfg.eval.max_batches)
    samples = _samples(cfg, engine, Path(manifest["tokenizer"]))
    result = {
        "samples": samples,
        "checkpoint": str(folder),
        "checkpoint_step": step,
        "test_loss": loss,
        "test_ppl": math.exp(loss),
        "test_tokens": tokens,
        "test_sequences_available": len(test),
        "seconds": round(time.time() - started, 2),
    }
    if engine.rank.is_first:
        files.write_json(layout.eval_done, result)
        report.write_report(layout)
        print(
            f"test loss {loss:.4f}, perplexity {math.exp(loss):.2f} over {tokens} tokens "
            f"({folder.name})",
            file=sys.stderr,
        )
    return result
