"""The trained model outside the pipeline: a checkpoint exported as a Hugging Face folder is
the same function in transformers (logits, greedy continuations, token ids), for the
Llama-shaped and the GPT-2-shaped models; a Llama made by transformers, read by the pipeline
(model.init_from) and exported again, comes back tensor for tensor."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data.tokenizer import load
from pipeline.evaluation.evaluate import single_device
from pipeline.evaluation.generate import continuation
from pipeline.exporting.steps import EXPORT
from pipeline.model import dist_checkpoint
from pipeline.model.huggingface import files as hf_files
from pipeline.model.huggingface import weights
from pipeline.model.huggingface.initial import convert
from pipeline.model.sizes import padded_vocab
from pipeline.training import checkpoint
from pipeline.training.engine import Engine
from pipeline.training.steps import TRAIN
from tests.conftest import SMALL, changed, copy_tokenized, make_config

transformers = pytest.importorskip("transformers")

TEXTS = [
    "def f(x):\n\treturn x * 2  # doubled\n",
    "Ünïcödé, 日本語 and emoji 🙂 after  two spaces",
    "\n\nleading newlines and trailing space ",
]
GPT2_SHAPE = [
    "model.activation=gelu",
    "model.normalization=LayerNorm",
    "model.position_embedding=learned_absolute",
    "model.num_query_groups=null",
    "model.untie_embeddings=false",
    "model.add_bias_linear=true",
]


def _trained(tokenized, workdir: Path, *overrides: str) -> PipelineConfig:
    cfg = make_config(copy_tokenized(tokenized, workdir), *SMALL, "export.dtype=fp32", *overrides)
    TRAIN.run(cfg)  # as the train step runs: its config.yaml too
    return cfg


@pytest.fixture(scope="module")
def llama_run(tokenized, tmp_path_factory) -> PipelineConfig:
    return _trained(tokenized, tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def tied_llama_run(tokenized, tmp_path_factory) -> PipelineConfig:
    return _trained(tokenized, tmp_path_factory.mktemp("tied"), "model.untie_embeddings=false")


@pytest.fixture(scope="module")
def gpt2_run(tokenized, tmp_path_factory) -> PipelineConfig:
    return _trained(tokenized, tmp_path_factory.mktemp("gpt2"), *GPT2_SHAPE)


def _megatron(cfg: PipelineConfig) -> tuple[torch.nn.Module, object]:
    """The run's best checkpoint in a megatron-core model, as the evaluation loads it."""
    paths = RunPaths.of(cfg.workdir)
    manifest = files.read_json(paths.manifest)
    folder = checkpoint.verified(paths.checkpoints, "best")
    layout = files.read_json(folder / "state.json")["layout"]
    engine = Engine(single_device(cfg), manifest["vocab_size"], layout["padded_vocab_size"])
    checkpoint.load(folder, engine.backend, engine.chunks, None)
    model = engine.chunks[0].eval()
    return model, load(manifest["tokenizer"])


def _ids(sp, count: int = 3) -> torch.Tensor:
    text = " ".join(TEXTS)
    ids = sp.encode(text)[:60]
    return torch.tensor([ids] * count)


@pytest.mark.parametrize("run", ["llama_run", "tied_llama_run", "gpt2_run"])
def test_exported_model_computes_the_same_logits_and_continuations(run, request):
    cfg = request.getfixturevalue(run)
    record = EXPORT.run(cfg)
    out = RunPaths.of(cfg.workdir).export_dir
    expected = "GPT2LMHeadModel" if run == "gpt2_run" else "LlamaForCausalLM"
    assert record["architecture"] == expected
    config = files.read_json(out / "config.json")
    assert config["architectures"] == [expected]
    assert config["tie_word_embeddings"] == (not cfg.model.untie_embeddings)
    stored = files.read_json(out / "model.safetensors.index.json")["weight_map"]
    assert ("lm_head.weight" in stored) == cfg.model.untie_embeddings
    assert EXPORT.is_complete(cfg)

    model, sp = _megatron(cfg)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == expected
    ids = _ids(sp)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        ours = model(ids, positions, None)[..., : sp.vocab_size()]
        theirs = hf(ids).logits
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)

    prompt = "The function returns"
    greedy = continuation(model, sp, prompt, 24, cfg.model.seq_length, torch.device("cpu"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    inputs = tokenizer(prompt, return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == sp.encode(prompt)  # no BOS slipped in
    generated = hf.generate(**inputs, max_new_tokens=24, do_sample=False)
    new = generated[0, inputs["input_ids"].shape[1] :].tolist()
    if sp.eos_id() in new:  # the pipeline stops at end-of-document, without the token
        new = new[: new.index(sp.eos_id())]
    assert new == greedy
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == sp.encode(text)
        assert tokenizer.decode(sp.encode(text)) == text


def test_bf16_export_loads_in_bf16_and_a_rerun_keeps_it(llama_run, tmp_path):
    cfg = changed(llama_run, "export", dtype="bf16", out=str(tmp_path / "hf"))
    first = EXPORT.run(cfg)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert next(hf.parameters()).dtype == torch.bfloat16
    index = files.read_json(tmp_path / "hf" / "model.safetensors.index.json")
    assert set(index["weight_map"]) == {n for n, _ in hf.named_parameters()}
    assert EXPORT.is_complete(cfg) and EXPORT.run(cfg) == first  # nothing redone


def test_export_never_overwrites_a_folder_it_did_not_make(llama_run, tmp_path):
    from pipeline.core.errors import ConfigError

    theirs = tmp_path / "models"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"^export.out=.*not an export"):
        EXPORT.run(changed(llama_run, "export", out=str(theirs)))
    assert (theirs / "notes.txt").read_text() == "mine"


def _tiny_llama(cfg: PipelineConfig, sp_model: Path, folder: Path) -> dict[str, torch.Tensor]:
    """A Llama made by transformers in the run's model shape, saved with the run's tokenizer."""
    m = cfg.model
    config = transformers.LlamaConfig(
        vocab_size=load(sp_model).vocab_size(),
        hidden_size=m.hidden_size,
        intermediate_size=m.ffn_hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_query_groups,
        max_position_embeddings=m.seq_length,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # norms away from 1, so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    shutil.copyfile(sp_model, folder / "tokenizer.model")
    return {n: p.detach().clone() for n, p in model.state_dict().items()}


def test_a_transformers_llama_goes_through_the_pipeline_and_back(tokenized, tmp_path):
    cfg = make_config(copy_tokenized(tokenized, tmp_path / "run"), *SMALL)
    sp_model = RunPaths.of(cfg.workdir).tokenizer_model
    original = _tiny_llama(cfg, sp_model, tmp_path / "llama")
    cfg = changed(cfg, "model", init_from=str(tmp_path / "llama"))
    vocab = load(sp_model).vocab_size()
    padded = padded_vocab(vocab, cfg.model, 1)

    # read as the training job reads it, into a megatron-core model
    convert(tmp_path / "llama", cfg.model, padded, tmp_path / "init")
    engine = Engine(single_device(cfg), vocab, padded)
    dist_checkpoint.load_weights(tmp_path / "init", engine.chunks)
    model = engine.chunks[0].eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama").eval()
    ids = _ids(load(sp_model))
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        ours = model(ids, positions, None)[..., :vocab]
        torch.testing.assert_close(ours, hf(ids).logits, rtol=1e-4, atol=1e-4)

    # saved as the pipeline saves a checkpoint, and exported back
    saved = tmp_path / "saved"
    dist_checkpoint.save(saved, dist_checkpoint.model_state(engine.chunks), on_cpu=True)
    back = weights.to_hf(
        hf_files.read_checkpoint(saved, weights.checkpoint_keys(cfg.model)), cfg.model, vocab
    )
    assert set(back) == set(original)
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name


def test_a_model_with_no_transformers_equivalent_is_refused_in_one_line(llama_run):
    from pipeline.core.errors import ConfigError
    from pipeline.model.huggingface.architectures import architecture

    model = dataclasses.replace(llama_run.model, normalization="LayerNorm")
    with pytest.raises(ConfigError) as refused:
        architecture(model)
    message = str(refused.value)
    assert message.startswith("model.normalization=LayerNorm:") and "\n" not in message
    gqa_gpt2 = make_config(llama_run.workdir, *SMALL, *GPT2_SHAPE[:-3], "model.num_query_groups=2")
    with pytest.raises(ConfigError, match=r"^model.num_query_groups=2: GPT2LMHeadModel"):
        architecture(gqa_gpt2.model)
