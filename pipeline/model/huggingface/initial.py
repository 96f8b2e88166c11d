"""model.init_from: a Hugging Face Llama's or Mixtral's weights as the run's starting point.

The first process of the training job converts them once into a checkpoint-format folder
(train/init/), then every rank loads it as it would load any checkpoint, which reshards it into
the run's tensor/pipeline layout. Its record names the folder's files, so other weights there
are converted again."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from pipeline.config import ModelConfig
from pipeline.core import files
from pipeline.model.huggingface import files as hf_files
from pipeline.model.huggingface import weights

RECORD = "DONE.json"


def convert(init_from: Path, model: ModelConfig, padded_vocab: int, target: Path) -> None:
    """Write the weights of the Llama or Mixtral in `init_from` into `target` (dist/ and
    DONE.json), unless it already holds them for this model and vocabulary padding (the MoE
    settings included: asdict, since the record is JSON)."""
    made_from = {
        "init_from": hf_files.identity(init_from),
        "model": {k: v for k, v in dataclasses.asdict(model).items() if k != "name"},
        "padded_vocab": padded_vocab,
    }
    if files.read_json_or_none(target / RECORD) == made_from:
        return
    tensors = hf_files.read_model(init_from, weights.hf_names(model))
    converted = weights.from_hf(tensors, model, padded_vocab)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    hf_files.write_checkpoint(partial, converted)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    files.write_json(target / RECORD, made_from)  # last: the folder is whole
