"""The export: a checkpoint's weights, read whole on the CPU from whatever layout wrote them,
renamed and reshaped into a Hugging Face model folder (config.json, safetensors shards and
index, generation_config.json) with the run's tokenizer, then export.json. The folder is
written as OUT.partial and renamed into place when whole."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.config import PipelineConfig
from pipeline.core import files, log
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.data.datasets import load_manifest
from pipeline.data.tokenizer import load
from pipeline.model.backends import names
from pipeline.model.huggingface import architectures, weights
from pipeline.model.huggingface.files import (
    EXPORT_RECORD,
    read_checkpoint,
    refuse_foreign,
    write_model,
)
from pipeline.model.huggingface.tokenizer import check_tokenizer, write_tokenizer
from pipeline.training import checkpoint

_log = log.get()

# a last look at the written tokenizer.json, beside the eval prompts: whitespace, newlines,
# digits and characters that only byte fallback encodes
CHECKED_TEXTS = ["", " a  b\t\n\n c ", "x = f(12345)\n    return x\n", "naïve 日本語 🙂 ᚠ"]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def export(cfg: PipelineConfig, made_from: MadeFrom, out: Path) -> dict[str, Any]:
    started = time.time()
    paths = RunPaths.of(cfg.workdir)
    refuse_foreign(out)
    model = cfg.model
    name = architectures.architecture(model)
    source = checkpoint.verified(paths.checkpoints, str(cfg.eval.checkpoint), cfg.eval.select_by)
    state = files.read_json(source / "state.json")
    manifest = load_manifest(paths)
    sp = load(manifest["tokenizer"])
    vocab = sp.vocab_size()
    special = {"bos": sp.bos_id(), "eos": sp.eos_id()}
    backend = state.get("layout", {}).get("backend", names.CPU)
    dtype = DTYPES[cfg.export.dtype]
    tensors = weights.to_hf(read_checkpoint(source, weights.checkpoint_keys(model)), model, vocab)
    config = architectures.hf_config(
        model, vocab, special, str(dtype).removeprefix("torch."), backend == names.CPU
    )

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    write_model(partial, config, tensors, dtype, int(cfg.export.shard_gb * 2**30))
    write_tokenizer(Path(manifest["tokenizer"]), partial, model.seq_length)
    check_tokenizer(Path(manifest["tokenizer"]), partial, [*cfg.eval.prompts, *CHECKED_TEXTS])
    files.write_json(
        partial / "generation_config.json",
        {"bos_token_id": special["bos"], "eos_token_id": special["eos"]},
    )
    record = {
        "made_from": made_from,
        "architecture": name,
        "checkpoint": str(source),
        "checkpoint_step": state["step"],
        "dtype": cfg.export.dtype,
        "vocab_size": vocab,
        "parameters": sum(t.numel() for t in tensors.values()),
        "seconds": round(time.time() - started, 2),
    }
    files.write_json(
        partial / EXPORT_RECORD, record
    )  # the marker: the folder is whole once renamed
    _replace(partial, out)
    _log.info(f"exported {source.name} as {name} to {out} ({cfg.export.dtype})")
    return record


def _replace(partial: Path, out: Path) -> None:
    """Rename `partial` to `out`; an earlier export there is moved aside first, then deleted."""
    old = out.with_name(out.name + ".replaced")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    partial.rename(out)
    files.fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)
