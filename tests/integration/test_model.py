"""The model the pipeline builds with megatron-core: its parameters are what the plan counts,
for differently shaped models (GeLU or SwiGLU, LayerNorm or RMSNorm, MHA, GQA or MQA, tied or
untied embeddings, learned or rotary positions)."""

from __future__ import annotations

import pytest

from pipeline.model import gpt
from pipeline.model.backends.cpu import CpuBackend
from pipeline.model.parameters import count_parameters, parameter_count, stage_params
from pipeline.model.sizes import padded_vocab
from pipeline.runtime import distributed
from tests.conftest import make_config

SMALL = ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4"]

# Differently shaped small models: (overrides, tokenizer vocabulary before padding).
SHAPES = {
    # gpt-125m shrunk: GeLU, LayerNorm, biases, tied embeddings, learned positions
    "gpt-125m-like": (["model=gpt-125m", *SMALL, "model.seq_length=32"], 500),
    # llama-like: SwiGLU, RMSNorm, GQA, untied, RoPE
    "llama-like": (
        ["model=tiny", *SMALL, "model.num_query_groups=2", "model.ffn_hidden_size=160"],
        1000,
    ),
    # GeLU with RMSNorm and no biases, untied, RoPE, plain multi-head, derived FFN (4h)
    "gelu-rmsnorm": (
        [
            "model=tiny",
            *SMALL,
            "model.activation=gelu",
            "model.num_query_groups=null",
            "model.ffn_hidden_size=null",
        ],
        300,
    ),
    # SwiGLU with LayerNorm and biases, tied, learned positions beyond the sequence, one
    # key/value head (MQA), derived FFN (8/3 h rounded to 64)
    "swiglu-layernorm-mqa": (
        [
            "model=gpt-125m",
            "model.num_layers=3",
            "model.hidden_size=96",
            "model.num_attention_heads=3",
            "model.num_query_groups=1",
            "model.activation=swiglu",
            "model.ffn_hidden_size=null",
            "model.seq_length=32",
            "model.max_position_embeddings=48",
        ],
        130,
    ),
    # GeLU, LayerNorm, biases, untied, RoPE, GQA, vocabulary padded to a multiple of 64
    "gelu-layernorm-gqa-untied": (
        [
            "model=gpt-125m",
            *SMALL,
            "model.num_attention_heads=8",
            "model.num_query_groups=4",
            "model.untie_embeddings=true",
            "model.position_embedding=rope",
            "model.ffn_hidden_size=96",
            "model.make_vocab_size_divisible_by=64",
        ],
        700,
    ),
}


@pytest.fixture(scope="module")
def model_parallel():
    """A single-process group with tensor and pipeline size 1, as the engine sets it up."""
    from megatron.core import parallel_state

    distributed.init("gloo")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _breakdown(gpt) -> dict[str, int]:
    """Per-layer attention / MLP / norm parameters of layer 0, by megatron-core's names."""
    counts = {"attention_per_layer": 0, "mlp_per_layer": 0, "norms_per_layer": 0}
    for name, param in gpt.named_parameters():
        if not name.startswith("decoder.layers.0."):
            continue
        if "layernorm" in name:
            counts["norms_per_layer"] += param.numel()
        elif ".self_attention." in name:
            counts["attention_per_layer"] += param.numel()
        elif ".mlp." in name:
            counts["mlp_per_layer"] += param.numel()
    return counts


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_parameter_count_equals_the_built_megatron_model(shape, model_parallel, tmp_path):
    overrides, vocab = SHAPES[shape]
    cfg = make_config(tmp_path, *overrides)
    model = gpt.build(cfg, vocab, CpuBackend())
    built = count_parameters(model)
    planned = parameter_count(cfg.model, vocab)
    assert {key: planned[key] for key in built} == built
    assert {key: planned[key] for key in _breakdown(model)} == _breakdown(model)
    position = sum(p.numel() for n, p in model.named_parameters() if "position_embeddings" in n)
    assert planned["position_embedding"] == position
    assert planned["padded_vocab"] == model.vocab_size == padded_vocab(vocab, cfg.model, 1)
    # one GPU holds the whole model
    assert stage_params(cfg.model, vocab, 1, 1, 0)["total"] == built["total"]
