"""The model the pipeline builds with megatron-core: its parameters are what the plan counts,
for differently shaped models (GeLU or SwiGLU, LayerNorm or RMSNorm, MHA, GQA or MQA, tied or
untied embeddings, learned or rotary positions); its padding rows of the vocabulary get no
probability."""

from __future__ import annotations

import pytest
import torch

from pipeline.model import gpt
from pipeline.model.backends.cpu import CpuBackend
from pipeline.model.parameters import count_parameters, parameter_count, stage_params
from pipeline.model.sizes import padded_vocab
from pipeline.model.vocab_padding import first_padding_column
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
    # squared ReLU (not gated), RMSNorm, no biases, derived FFN (4h)
    "squared-relu": (
        ["model=tiny", *SMALL, "model.activation=squared_relu", "model.ffn_hidden_size=null"],
        300,
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


def test_a_squared_relu_mlp_computes_relu_squared(model_parallel, tmp_path):
    cfg = make_config(tmp_path, *SHAPES["squared-relu"][0])
    torch.manual_seed(0)
    mlp = gpt.build(cfg, 300, CpuBackend()).decoder.layers[0].mlp
    x = torch.randn(5, 2, cfg.model.hidden_size)
    fc1, _ = mlp.linear_fc1(x)
    assert fc1.shape[-1] == 4 * cfg.model.hidden_size  # ungated: one projection
    expected, _ = mlp.linear_fc2(torch.relu(fc1) ** 2)
    assert torch.allclose(mlp(x)[0], expected)


def test_the_vocabulary_padding_gets_no_probability_and_no_gradient(model_parallel, tmp_path):
    """1000 pieces padded to 1024 rows: the loss is that of a softmax over the 1000 real
    logits (what the exported model computes), and the padding rows learn nothing from it."""
    cfg = make_config(tmp_path, *SHAPES["llama-like"][0], "model.seq_length=16")
    vocab = 1000
    torch.manual_seed(0)
    model = gpt.build(cfg, vocab, CpuBackend())
    assert model.vocab_size == 1024
    tokens = torch.randint(0, vocab, (2, 16))
    positions = torch.arange(16).expand(2, 16)
    logits = model(tokens, positions, None)
    assert (logits[..., vocab:] == torch.finfo(logits.dtype).min).all()
    labels = torch.randint(0, vocab, (2, 16))
    loss = model(tokens, positions, None, labels=labels)
    real = torch.nn.functional.cross_entropy(
        logits[..., :vocab].flatten(0, 1), labels.flatten(), reduction="none"
    )
    torch.testing.assert_close(loss.flatten(), real, rtol=1e-6, atol=1e-6)
    loss.sum().backward()
    grad = model.output_layer.weight.grad
    assert grad[vocab:].abs().max() == 0 and grad[:vocab].abs().max() > 0


@pytest.mark.parametrize(
    ("width", "rank", "first"),
    [
        (1024, 0, 1000),  # one rank, or gathered logits: the whole padded vocabulary
        (512, 0, 512),  # two ranks: the first shard holds no padding
        (512, 1, 488),  # the second holds ids 512..1023, 1000 onwards padding
        (256, 3, 232),
        (256, 2, 256),
    ],
)
def test_each_tensor_parallel_shard_masks_its_own_padding_columns(width, rank, first):
    assert first_padding_column(1000, 1024, width, rank) == first


def test_a_shard_of_padding_alone_is_masked_whole():
    assert first_padding_column(64, 256, 128, 1) == 0  # ids 128..255: all padding


def test_a_squared_relu_mlp_applies_relu_squared(model_parallel, tmp_path):
    """model.activation=squared_relu: megatron-core's squared_relu between FC1 and FC2, not
    gated; on GPUs megatron-core's function, as Transformer Engine's op has none."""
    from megatron.core.activations import squared_relu

    from pipeline.model.backends import te

    cfg = make_config(tmp_path, "model=tiny", *SMALL, "model.activation=squared_relu")
    mlp = gpt.build(cfg, 300, CpuBackend()).decoder.layers[0].mlp
    assert mlp.activation_func is squared_relu and not mlp.config.gated_linear_unit
    x = torch.randn(5, 1, 64)
    fc1 = torch.nn.functional.linear(x, mlp.linear_fc1.weight)
    expected = torch.nn.functional.linear(torch.relu(fc1) ** 2, mlp.linear_fc2.weight)
    torch.testing.assert_close(mlp(x)[0], expected)
    assert not te.te_activation(cfg) and not te.bias_activation_fusion(cfg)
    swiglu = make_config(tmp_path, "model=tiny", *SMALL)
    assert te.te_activation(swiglu) and te.bias_activation_fusion(swiglu)


@pytest.mark.parametrize(
    "layers,pipeline,virtual,embedding,loss",
    [
        (126, 16, None, True, True),  # Llama 3.1 405B, PP=16: 7 + 14 x 8 + 7
        (126, 8, 8, True, True),  # and PP=8 x VP=8: a first chunk of one layer
        (3, 2, None, True, False),  # the CPU test's 1 + 2
        (5, 2, None, False, True),
        (8, 4, 2, False, False),
    ],
)
def test_the_stage_split_is_the_one_megatron_core_builds(
    layers, pipeline, virtual, embedding, loss
):
    """What the plan counts per stage is what megatron-core builds on each pipeline rank, and
    the ranks' layers, numbered as checkpoints name them, are each layer of the model once."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from pipeline.model.stages import PipelineSplit

    config = TransformerConfig(
        num_layers=layers,
        hidden_size=8,
        num_attention_heads=1,
        pipeline_model_parallel_size=pipeline,
        virtual_pipeline_model_parallel_size=virtual,
        account_for_embedding_in_pipeline_split=embedding,
        account_for_loss_in_pipeline_split=loss,
        pipeline_dtype=torch.float32,
    )
    split, numbered = PipelineSplit(embedding, loss), []
    for stage in range(pipeline):
        chunks = range(virtual) if virtual else [None]
        built = [get_num_layers_to_build(config, vp, stage) for vp in chunks]
        assert split.layers(layers, pipeline, stage) == sum(built), stage
        for vp, n in zip(chunks, built, strict=True):
            offset = get_transformer_layer_offset(config, vp, stage)
            numbered += range(offset, offset + n)
    assert sorted(numbered) == list(range(layers))
