"""Continued pretraining from a Hugging Face Llama as a user runs it: `model.init_from=DIR` on
the command line, the Llama's tokenizer taken from its folder, the export stage at the end;
mistakes in the folder refused in one line before anything runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.paths import RunPaths
from tests.conftest import ROOT, SMALL_SERIAL, cli

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402  (after the skip: transformers brings it)

# the run's model.* settings (SMALL) as a Llama config
SHAPE = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module")
def llama(tokenized, tmp_path_factory) -> Path:
    """A Llama made by transformers with the tokenized run's sentencepiece model."""
    folder = tmp_path_factory.mktemp("llama")
    sp_model = RunPaths.of(tokenized.workdir).tokenizer_model
    import sentencepiece as spm

    vocab = spm.SentencePieceProcessor(model_file=str(sp_model)).vocab_size()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=vocab, **SHAPE))
    model.save_pretrained(folder)
    shutil.copyfile(sp_model, folder / "tokenizer.model")
    return folder


def test_a_run_continues_a_llama_and_exports_it(llama, tmp_path):
    workdir = tmp_path / "run"
    result = cli(
        f"workdir={workdir}",
        *SMALL_SERIAL,
        f"model.init_from={llama}",
        "stages=[tokenize,train,evaluate,export]",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"started from the weights of {llama}" in result.stderr
    paths = RunPaths.of(workdir)
    tokenizer = json.loads(paths.tokenizer_meta.read_text())
    assert tokenizer["source"] == str((llama / "tokenizer.model").resolve())
    metrics = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
    assert [m["initialized_from"] for m in metrics if "initialized_from" in m] == [str(llama)]

    exported = transformers.AutoModelForCausalLM.from_pretrained(paths.export_dir)
    assert exported.config.num_hidden_layers == SHAPE["num_hidden_layers"]
    record = json.loads((paths.export_dir / "export.json").read_text())
    assert record["checkpoint_step"] == 20 and record["architecture"] == "LlamaForCausalLM"

    # the export by hand, elsewhere; then again, with nothing to do
    out = tmp_path / "hf"
    command = [sys.executable, "-m", "pipeline.export", f"workdir={workdir}", f"out={out}"]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (out / "tokenizer.json").exists() and (out / "export.json").exists()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already complete" in again.stderr


def _refused(*args: str) -> str:
    result = cli(*SMALL_SERIAL, *args)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_a_llama_of_another_shape_is_refused_before_anything_runs(llama, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(llama, other)
    config = json.loads((other / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (other / "config.json").write_text(json.dumps(config))
    error = _refused(f"workdir={tmp_path / 'run'}", f"model.init_from={other}")
    assert error == (
        f"error: model.init_from={other}: model.num_layers is 2, the checkpoint's is 3\n"
    )
    assert not (tmp_path / "run").exists()


def test_a_folder_without_a_tokenizer_or_weights_is_refused_in_one_line(llama, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(llama, bare)
    (bare / "tokenizer.model").unlink()
    error = _refused(f"workdir={tmp_path / 'a'}", f"model.init_from={bare}")
    assert error.startswith(f"error: model.init_from: {bare} has no tokenizer.model")
    error = _refused(f"workdir={tmp_path / 'b'}", f"model.init_from={tmp_path / 'nowhere'}")
    assert error == f"error: model.init_from: {tmp_path / 'nowhere'} is not a folder\n"
    shutil.copyfile(llama / "tokenizer.model", bare / "tokenizer.model")
    for weights in bare.glob("*.safetensors"):
        weights.unlink()
    error = _refused(f"workdir={tmp_path / 'c'}", f"model.init_from={bare}")
    assert error.startswith(f"error: model.init_from={bare}: no model.safetensors")
