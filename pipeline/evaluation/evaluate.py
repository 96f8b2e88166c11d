"""The evaluation: loss, perplexity and bits per byte of a checkpoint (the best, by default) on the
held-out test split and on the extra sets (see pipeline.data.evalsets for what is measured), the
test loss of every checkpoint kept (eval.all_checkpoints), text samples, then the report
(downstream tasks are scored by a step of their own, pipeline.evaluation.downstream). eval/DONE.json is written last, then the trackers of logging.* receive
the results and the report."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import TypedDict

import torch

from pipeline.config import PipelineConfig
from pipeline.config.derived import settled
from pipeline.core import files, log, provenance
from pipeline.core.paths import RunPaths
from pipeline.data import evalsets, sources
from pipeline.data.datasets import check_sources, check_splits, load_manifest
from pipeline.data.token_bytes import TokenBytes
from pipeline.data.tokenizer import load
from pipeline.evaluation.generate import continuation
from pipeline.reporting.report import write_report
from pipeline.runtime.device import resolve_device
from pipeline.tracking.trackers import Trackers
from pipeline.training import checkpoint
from pipeline.training.engine import Engine

_log = log.get()


def single_device(cfg: PipelineConfig) -> PipelineConfig:
    """The run's config for the evaluation job: one process on one GPU, or on the CPU, whatever
    layout trained the checkpoint (dist_checkpoint reshards the weights as they load)."""
    return one_stage(cfg, tensor=1)


def one_stage(cfg: PipelineConfig, tensor: int) -> PipelineConfig:
    """The run's config for a job that runs the model forward only, whole on each group of
    `tensor` tensor-parallel ranks (no pipeline stages; the job's other ranks are data-parallel),
    whatever layout trained the checkpoint. No sequence parallelism: its requests are of any
    length."""
    parallel = dataclasses.replace(
        cfg.parallel,
        tensor=tensor,
        pipeline=1,
        virtual_pipeline=None,
        sequence_parallel=False,
        expert=1,
        expert_tensor=None,
    )
    train = dataclasses.replace(cfg.train, recompute="none")  # nothing kept for a backward pass
    if resolve_device(cfg.train.device) == "cpu":
        train = dataclasses.replace(train, precision="fp32")  # bf16/fp8 weights read into fp32
    return dataclasses.replace(cfg, parallel=parallel, train=train)


def _samples(cfg: PipelineConfig, model: torch.nn.Module, sp, device: torch.device) -> list[dict]:
    """Greedy and top-k/top-p continuations of the configured prompts, with their token ids."""
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


def perplexity(loss: float) -> float:
    """exp(loss); infinite where that overflows (a diverged model's loss of hundreds of nats),
    reported as such rather than failing the evaluation."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def _micro_batch_size(cfg: PipelineConfig) -> int:
    return cfg.eval.micro_batch_size or settled(cfg).micro_batch_size


def bits_per_byte(loss: float, tokens: int, text_bytes: int) -> float:
    """The summed loss over the tokens, in bits, per UTF-8 byte of the text they encode."""
    return loss * tokens / (math.log(2) * text_bytes) if text_bytes else math.nan


def _measure(engine, evalset: evalsets.EvalSet, cfg: PipelineConfig, counted: TokenBytes) -> dict:
    loss, tokens = engine.loss_over(evalset.windows, _micro_batch_size(cfg), cfg.eval.max_batches)
    text_bytes = evalset.windows.text_bytes(1, 1 + tokens, counted)  # the tokens predicted
    result = {
        "loss": loss,
        "ppl": perplexity(loss),
        "bpb": bits_per_byte(loss, tokens, text_bytes),
        "bytes": text_bytes,
        "tokens": tokens,
        "documents": evalset.documents,
        "windows": evalset.windows.windows,
    }
    if evalset.files:  # an extra set
        result.update(files=evalset.files, rejected=evalset.rejected)
    return result


def _measure_test(
    engine, tests: list[evalsets.EvalSet], cfg: PipelineConfig, counted: TokenBytes
) -> dict[str, dict]:
    """The test split of each source and, for a mixture, "test": the sources' losses (and bits
    per byte) weighted as training samples them (the loss validation picks the best checkpoint
    by)."""
    measured = {s.name: _measure(engine, s, cfg, counted) for s in tests}
    if len(tests) == 1:
        return measured
    by_source = {name.removeprefix("test/"): r["loss"] for name, r in measured.items()}
    loss = evalsets.mixture_loss(by_source, cfg)
    bpb = {name.removeprefix("test/"): r["bpb"] for name, r in measured.items()}
    overall = {
        "loss": loss,
        "ppl": perplexity(loss),
        "bpb": evalsets.mixture_loss(bpb, cfg),
        **{
            k: sum(r[k] for r in measured.values())
            for k in ("tokens", "bytes", "documents", "windows")
        },
        "weights": sources.weights(cfg.data),
    }
    return {"test": overall, **measured}


def _every_checkpoint(
    cfg: PipelineConfig,
    engine,
    tests: list[evalsets.EvalSet],
    counted: TokenBytes,
    best: Path,
    best_result: dict,
) -> list[dict]:
    """Test loss of each valid checkpoint kept by retention, by step (the engine ends up holding
    the last one's weights)."""
    rows = []
    for folder in checkpoint.finished(RunPaths.of(cfg.workdir).checkpoints):
        if folder.resolve() == best:  # verified when it was chosen
            result = best_result
        elif not checkpoint.is_valid(folder):
            continue
        else:
            checkpoint.load(folder, engine.backend, engine.chunks, None)
            result = _measure_test(engine, tests, cfg, counted)["test"]
        state = files.read_json(folder / "state.json")
        rows.append(
            {
                "checkpoint": folder.name,
                "step": state["step"],
                "val_loss": state.get("val_loss"),
                "test_loss": result["loss"],
                "test_ppl": result["ppl"],
                "test_bpb": result["bpb"],
            }
        )
    return rows


class EvaluationRecord(TypedDict, total=False):
    """eval/DONE.json: what the evaluation measured, and what it was made from."""

    made_from: dict  # (pipeline.core.provenance; pipeline.evaluation.steps)
    fingerprint: str
    checkpoint: str
    checkpoint_step: int
    test_loss: float
    test_ppl: float
    test_bpb: float  # bits per byte: the test loss per UTF-8 byte of the text, any tokenizer
    test_tokens: int
    sets: dict[str, dict]  # by set name, "test" first (then "test/SOURCE" for a mixture)
    samples: list[dict]
    checkpoints: list[dict]  # eval.all_checkpoints
    gpus: int
    checkpoint_layout: dict
    seconds: float


def evaluate(cfg: PipelineConfig, made_from: dict) -> EvaluationRecord:
    """Measure, sample, write the report, then eval/DONE.json (every time it is called);
    `made_from`: what the evaluation is made from, for its marker."""
    paths = RunPaths.of(cfg.workdir)
    started = time.time()
    manifest = load_manifest(paths)
    check_sources(cfg, manifest)
    check_splits(manifest, cfg.model.seq_length, ("test",))
    folder = checkpoint.verified(paths.checkpoints, str(cfg.eval.checkpoint), cfg.eval.select_by)
    # the vocabulary as padded for the checkpoint's tensor-parallel size (older saves: ours)
    written = files.read_json(folder / "state.json").get("layout", {})
    engine = Engine(single_device(cfg), manifest["vocab_size"], written.get("padded_vocab_size"))
    sp = load(manifest["tokenizer"])
    # whole micro-batches on every data-parallel rank: the sets are padded with masked windows
    multiple = _micro_batch_size(cfg) * engine.dp_size
    tests = evalsets.test_sets(cfg, manifest, multiple)
    extras = [evalsets.extra_set(cfg, name, sp, multiple) for name in cfg.eval.extra_sets]
    trained_steps = checkpoint.load(folder, engine.backend, engine.chunks, None)["step"]
    counted = TokenBytes(sp)
    measured = _measure_test(engine, tests, cfg, counted)
    measured.update({s.name: _measure(engine, s, cfg, counted) for s in extras})
    test = measured["test"]
    model = engine.chunks[0]
    result: EvaluationRecord = {
        "made_from": made_from,
        "fingerprint": provenance.fingerprint(made_from),
        "checkpoint": str(folder),
        "checkpoint_step": trained_steps,
        "test_loss": test["loss"],
        "test_ppl": test["ppl"],
        "test_bpb": test["bpb"],
        "test_tokens": test["tokens"],
        "sets": measured,
        "samples": _samples(cfg, model, sp, engine.device),
    }
    if cfg.eval.all_checkpoints:
        result["checkpoints"] = _every_checkpoint(cfg, engine, tests, counted, folder, test)
    result["gpus"] = 1 if engine.device.type == "cuda" else 0
    result["checkpoint_layout"] = written
    result["seconds"] = round(time.time() - started, 2)
    if engine.rank.is_first:
        for name, r in measured.items():
            _log.info(
                f"{name} loss {r['loss']:.4f}, perplexity {r['ppl']:.2f}, "
                f"{r['bpb']:.4f} bits per byte over {r['tokens']} tokens ({folder.name})"
            )
        write_report(paths, result)
        files.write_json(paths.eval_done, result)  # last: the marker of a complete evaluation
        trackers = Trackers.open(cfg, paths)  # the training's tracker run, continued
        trackers.results(result)
        trackers.finish()
    return result
