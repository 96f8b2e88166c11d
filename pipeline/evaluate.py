"""The evaluation stage: loss and perplexity of a checkpoint (the best, by default) on the
held-out test split and on the extra sets (see pipeline.evalsets for what is measured), the
test loss of every checkpoint kept (eval.all_checkpoints), text samples, lm-evaluation-harness
tasks, then the report. eval/DONE.json is written last."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline import checkpoint, data, evalsets, files, harness, report
from pipeline.graph import evaluate_complete
from pipeline.layout import RunLayout


def resolve_checkpoint(cfg: DictConfig) -> Path:
    root = RunLayout.of(cfg.workdir).checkpoints
    choice = str(cfg.eval.checkpoint)
    if choice in ("best", "latest"):  # each returns a verified checkpoint, or None
        folder = {"best": checkpoint.best, "latest": checkpoint.latest}[choice](root)
    else:
        folder = Path(choice) if checkpoint.is_valid(Path(choice)) else None
    if folder is None:
        raise FileNotFoundError(f"eval.checkpoint={choice}: no valid checkpoint under {root}")
    return folder.resolve()


def single_device(cfg: DictConfig) -> DictConfig:
    """The run's config for the evaluation job: one process on one GPU, or on the CPU, whatever
    layout trained the checkpoint (dist_checkpoint reshards the weights as they load)."""
    from pipeline.backend import resolve_device

    local = cfg.copy()
    with open_dict(local):
        local.parallel.tensor = local.parallel.pipeline = 1
        local.parallel.virtual_pipeline = None
        local.parallel.sequence_parallel = False
        local.train.recompute = "none"  # nothing is kept for a backward pass
        if resolve_device(cfg) == "cpu":
            local.train.precision = "fp32"  # bf16/fp8 weights read into fp32
    return local


def _samples(cfg: DictConfig, model: torch.nn.Module, sp, device: torch.device) -> list[dict]:
    """Greedy and top-k/top-p continuations of the configured prompts, with their token ids."""
    from pipeline.generate import continuation

    e = cfg.eval
    out = []
    for prompt in e.prompts:
        common = dict(
            max_new_tokens=e.max_new_tokens, seq_length=cfg.model.seq_length, device=device
        )
        greedy = continuation(model, sp, prompt, **common)
        sampled = continuation(
            model, sp, prompt, top_k=e.top_k, top_p=e.top_p, seed=cfg.train.seed, **common
        )
        out.append(
            {
                "prompt": prompt,
                "greedy": sp.decode(greedy),
                "greedy_ids": greedy,
                "sampled": sp.decode(sampled),
                "sampled_ids": sampled,
            }
        )
    return out


def _micro_batch_size(cfg: DictConfig) -> int:
    return cfg.eval.micro_batch_size or cfg.train.micro_batch_size


def _measure(engine, evalset: evalsets.EvalSet, cfg: DictConfig) -> dict:
    loss, tokens = engine.loss_over(evalset.windows, _micro_batch_size(cfg), cfg.eval.max_batches)
    result = {
        "loss": loss,
        "ppl": math.exp(loss),
        "tokens": tokens,
        "documents": evalset.documents,
        "windows": evalset.windows.windows,
    }
    if evalset.name != "test":
        result.update(files=evalset.files, rejected=evalset.rejected)
    return result


def _every_checkpoint(
    cfg: DictConfig, engine, test: evalsets.EvalSet, best: Path, best_result: dict
) -> list[dict]:
    """Test loss of each valid checkpoint kept by retention, by step (the engine ends up holding
    the last one's weights)."""
    rows = []
    for folder in checkpoint.finished(RunLayout.of(cfg.workdir).checkpoints):
        if folder.resolve() == best:  # verified when it was chosen
            result = best_result
        elif not checkpoint.is_valid(folder):
            continue
        else:
            checkpoint.load(folder, engine.backend, engine.chunks, None)
            result = _measure(engine, test, cfg)
        state = files.read_json(folder / "state.json")
        rows.append(
            {
                "checkpoint": folder.name,
                "step": state["step"],
                "val_loss": state.get("val_loss"),
                "test_loss": result["loss"],
                "test_ppl": result["ppl"],
            }
        )
    return rows


def run(cfg: DictConfig) -> dict:
    from pipeline.engine import Engine
    from pipeline.tokenizer import load

    layout = RunLayout.of(cfg.workdir)
    if evaluate_complete(cfg):
        return files.read_json(layout.eval_done)
    started = time.time()
    manifest = data.load_manifest(cfg)
    folder = resolve_checkpoint(cfg)
    # the vocabulary as padded for the checkpoint's tensor-parallel size (older saves: ours)
    written = files.read_json(folder / "state.json").get("layout", {})
    engine = Engine(single_device(cfg), written.get("padded_vocab_size", manifest["vocab_size"]))
    sp = load(manifest["tokenizer"])
    # whole micro-batches on every data-parallel rank: the sets are padded with masked windows
    multiple = _micro_batch_size(cfg) * engine.dp_size
    sets = [evalsets.test_split(cfg, manifest, multiple)]
    sets += [evalsets.extra_set(cfg, name, sp, multiple) for name in cfg.eval.extra_sets]
    if not sets[0].windows.windows:
        raise RuntimeError(f"data.split={cfg.data.split}: the test split holds no tokens")
    step = checkpoint.load(folder, engine.backend, engine.chunks, None)["step"]
    measured = {s.name: _measure(engine, s, cfg) for s in sets}
    test = measured["test"]
    model = engine.chunks[0]
    result = {
        "checkpoint": str(folder),
        "checkpoint_step": step,
        "test_loss": test["loss"],
        "test_ppl": test["ppl"],
        "test_tokens": test["tokens"],
        "sets": measured,
        "samples": _samples(cfg, model, sp, engine.device),
        "harness": harness.run(cfg, model, sp, engine.device),
        "config": OmegaConf.to_container(cfg.eval, resolve=True),  # what this result is for
    }
    if cfg.eval.all_checkpoints:
        result["checkpoints"] = _every_checkpoint(cfg, engine, sets[0], folder, test)
    result["gpus"] = 1 if engine.device.type == "cuda" else 0
    result["checkpoint_layout"] = written
    result["seconds"] = round(time.time() - started, 2)
    if engine.rank.is_first:
        for name, r in measured.items():
            print(
                f"{name} loss {r['loss']:.4f}, perplexity {r['ppl']:.2f} over {r['tokens']} "
                f"tokens ({folder.name})",
                file=sys.stderr,
            )
        report.write_report(layout, result)
        files.write_json(layout.eval_done, result)  # last: the marker of a complete evaluation
    return result
