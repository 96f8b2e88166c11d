"""A trained mixture of experts outside the pipeline: exported as a Hugging Face Mixtral, it is
the same function in transformers (logits, and the test perplexity the evaluation reported);
read back by model.init_from it is the same model again, and training continues from it; what
Mixtral does not compute is refused in one line naming the key."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.errors import ConfigError
from pipeline.core.paths import RunPaths
from pipeline.evaluation.evaluate import single_device
from pipeline.evaluation.steps import EVALUATE
from pipeline.exporting.steps import EXPORT
from pipeline.model import dist_checkpoint
from pipeline.model.huggingface import architectures, weights
from pipeline.model.huggingface import files as hf_files
from pipeline.model.huggingface.initial import convert
from pipeline.model.sizes import padded_vocab
from pipeline.training import checkpoint
from pipeline.training.engine import Engine
from pipeline.training.steps import TRAIN
from tests.conftest import ROOT, SMALL, changed, copy_tokenized, make_config
from tests.integration.test_hf_export import _ids, _megatron

transformers = pytest.importorskip("transformers")

# SMALL's attention with 8 experts of width 128 in both layers, 2 per token
MOE = ["model=moe-tiny", "model.moe.first_dense_layers=0", "export.dtype=fp32"]


@pytest.fixture(scope="module")
def moe_run(tokenized, tmp_path_factory) -> PipelineConfig:
    """A mixture of experts trained, evaluated and exported."""
    workdir = copy_tokenized(tokenized, tmp_path_factory.mktemp("moe"))
    cfg = make_config(workdir, *SMALL, *MOE)
    TRAIN.run(cfg)
    EVALUATE.run(cfg)
    EXPORT.run(cfg)
    return cfg


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token loss of `ids` under `logits` (over the tokenizer's pieces)."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def test_a_mixture_of_experts_exports_as_mixtral_with_the_pipelines_perplexity(moe_run):
    out = RunPaths.of(moe_run.workdir).export_dir
    record = files.read_json(out / "export.json")
    assert record["architecture"] == "MixtralForCausalLM"
    config = files.read_json(out / "config.json")
    assert config["num_local_experts"] == 8 and config["num_experts_per_tok"] == 2
    assert config["intermediate_size"] == 128  # each expert's width, not model.ffn_hidden_size

    model, sp = _megatron(moe_run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "MixtralForCausalLM"
    ids = _ids(sp)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        ours = model(ids, positions, None)[..., : sp.vocab_size()]
        theirs = hf(ids).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)

    # the evaluation's test windows, scored by transformers
    result = subprocess.run(
        [sys.executable, "tools/hf_perplexity.py", f"--workdir={moe_run.workdir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    test = json.loads(result.stdout)["sets"]["test"]
    assert test["transformers_tokens"] == test["pipeline_tokens"] > 0
    assert abs(test["ppl_relative_difference"]) <= 1e-4, test


def test_an_exported_mixtral_read_by_init_from_is_the_same_model_and_trains_on(moe_run, tmp_path):
    exported = RunPaths.of(moe_run.workdir).export_dir
    vocab = files.read_json(exported / "export.json")["vocab_size"]
    cfg = make_config(
        copy_tokenized(moe_run, tmp_path / "run"), *SMALL, *MOE, f"model.init_from={exported}"
    )
    assert architectures.mismatch(cfg.model, hf_files.read_config(exported)) is None
    padded = padded_vocab(vocab, cfg.model, 1)

    # read as the training job reads it: the first loss is the exported model's
    convert(exported, cfg.model, padded, tmp_path / "init")
    engine = Engine(single_device(cfg), vocab, padded)
    dist_checkpoint.load_weights(tmp_path / "init", engine.chunks)
    imported = engine.chunks[0].eval()
    trained, sp = _megatron(moe_run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    ids = _ids(sp)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        loss = _loss(imported(ids, positions, None)[..., :vocab], ids)
        torch.testing.assert_close(loss, _loss(trained(ids, positions, None)[..., :vocab], ids))
        torch.testing.assert_close(loss, _loss(hf(ids).logits, ids), rtol=1e-5, atol=1e-5)

    # the training job continues from it: at a learning rate of 1e-9, two steps on, its
    # checkpoint still holds the exported weights
    cfg = changed(cfg, "train", steps=2, warmup_steps=0, lr=1e-9, min_lr=0.0, save_interval=2)
    TRAIN.run(cfg)
    folder = checkpoint.verified(RunPaths.of(cfg.workdir).checkpoints, "latest")
    saved = hf_files.read_checkpoint(folder, weights.checkpoint_keys(cfg.model))
    back = weights.to_hf(saved, cfg.model, vocab)
    original = hf_files.read_model(exported, list(back))
    assert set(back) == set(original)
    for name, tensor in original.items():
        torch.testing.assert_close(back[name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("override", "start"),
    [
        ("first_dense_layers=1", "model.moe.first_dense_layers=1: MixtralForCausalLM"),
        ("shared_expert_ffn_hidden_size=64", "model.moe.shared_expert_ffn_hidden_size=64:"),
        ("capacity_factor=1.0", "model.moe.capacity_factor=1.0: megatron-core drops"),
        ("router=aux_loss_free", "model.moe.router=aux_loss_free: its sigmoid router"),
        ("top_k=1", "model.moe.top_k=1: megatron-core weighs"),
    ],
)
def test_a_mixture_mixtral_does_not_compute_is_refused_in_one_line(tmp_path, override, start):
    model = make_config(tmp_path, *SMALL, *MOE, f"model.moe.{override}").model
    with pytest.raises(ConfigError) as refused:
        architectures.architecture(model)
    assert str(refused.value).startswith(start) and "\n" not in str(refused.value)


def test_init_from_compares_the_experts_with_the_mixtrals(tmp_path):
    model = make_config(tmp_path, *SMALL, *MOE).model
    hf = architectures.hf_config(model, 512, {"bos": 1, "eos": 2}, "float32", False)
    assert architectures.mismatch(model, hf) is None
    for key, value in [("top_k", 4), ("experts", 16), ("ffn_hidden_size", 64)]:
        other = dataclasses.replace(model, moe=dataclasses.replace(model.moe, **{key: value}))
        have = 128 if key == "ffn_hidden_size" else getattr(model.moe, key)
        assert architectures.mismatch(other, hf) == (
            f"model.moe.{key} is {value}, the checkpoint's is {have}"
        )
    first_dense = dataclasses.replace(
        model, moe=dataclasses.replace(model.moe, first_dense_layers=1)
    )
    assert architectures.mismatch(first_dense, hf) == (
        "model.moe.first_dense_layers is 1, the checkpoint's is 0"
    )
    dense = dataclasses.replace(model, moe=dataclasses.replace(model.moe, experts=0))
    assert architectures.mismatch(dense, hf) == "model.moe.experts is 0, the checkpoint's is 8"
    llama = architectures.hf_config(dense, 512, {"bos": 1, "eos": 2}, "float32", False)
    assert architectures.mismatch(model, llama) == "model.moe.experts is 8, the checkpoint's is 0"
