"""Parameter counts of the model `gpt.build` makes, by arithmetic on its shape (no torch):
the whole replica, and one GPU's share under tensor and pipeline parallelism. Tests compare
them with the megatron-core model itself."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ModelConfig
from pipeline.model.sizes import ffn_hidden_size, padded_vocab
from pipeline.model.stages import EVEN, PipelineSplit


@dataclass(frozen=True)
class Part:
    """Parameters split across tensor-parallel ranks (sharded) or held whole by each rank."""

    sharded: int = 0
    replicated: int = 0

    @property
    def total(self) -> int:
        return self.sharded + self.replicated

    def per_rank(self, tensor: int) -> int:
        return self.sharded // tensor + self.replicated

    def __add__(self, other: Part) -> Part:
        return Part(self.sharded + other.sharded, self.replicated + other.replicated)

    def __mul__(self, n: int) -> Part:
        return Part(self.sharded * n, self.replicated * n)


def _linear(fan_in: int, fan_out: int, bias: bool, row_parallel: bool) -> Part:
    """A column-parallel linear shards weight and bias; a row-parallel one keeps its bias whole."""
    weight = Part(sharded=fan_in * fan_out)
    if not bias:
        return weight
    return weight + (Part(replicated=fan_out) if row_parallel else Part(sharded=fan_out))


def _norm(m: ModelConfig) -> Part:
    h = m.hidden_size
    return Part(replicated=2 * h if m.normalization == "LayerNorm" else h)


def attention_params(m: ModelConfig) -> Part:
    kv_channels = m.hidden_size // m.num_attention_heads
    groups = m.num_query_groups or m.num_attention_heads
    qkv_width = kv_channels * (m.num_attention_heads + 2 * groups)
    query_width = kv_channels * m.num_attention_heads
    bias = m.add_bias_linear
    return _linear(m.hidden_size, qkv_width, bias, False) + _linear(
        query_width, m.hidden_size, bias, True
    )


def mlp_params(m: ModelConfig) -> Part:
    ffn = ffn_hidden_size(m)
    fc1_width = 2 * ffn if m.activation == "swiglu" else ffn  # gate and up projections stacked
    bias = m.add_bias_linear
    return _linear(m.hidden_size, fc1_width, bias, False) + _linear(ffn, m.hidden_size, bias, True)


def linear_weights(m: ModelConfig) -> int:
    """Weights of one layer's four GEMMs, biases left out (what fp8 casts)."""
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    head_dim = m.hidden_size // heads
    ffn = ffn_hidden_size(m)
    fc1_width = 2 * ffn if m.activation == "swiglu" else ffn
    qkv = m.hidden_size * head_dim * (heads + 2 * groups)
    return qkv + head_dim * heads * m.hidden_size + (fc1_width + ffn) * m.hidden_size


def layer_params(m: ModelConfig) -> dict[str, Part]:
    """One transformer layer: attention, MLP, and its two norms (fused into the next linear by
    Transformer Engine; the same count)."""
    return {"attention": attention_params(m), "mlp": mlp_params(m), "norms": _norm(m) * 2}


def embedding_params(m: ModelConfig, vocab_size: int, tensor: int) -> dict[str, Part]:
    word = Part(sharded=padded_vocab(vocab_size, m, tensor) * m.hidden_size)
    position = Part()
    if m.position_embedding == "learned_absolute":  # a plain embedding, whole on every rank
        position = Part(replicated=(m.max_position_embeddings or m.seq_length) * m.hidden_size)
    return {"word": word, "position": position}


def output_params(m: ModelConfig, vocab_size: int, tensor: int, pipeline: int = 1) -> Part:
    """The output layer: its own weight when untied; with tied embeddings, a copy on the last
    pipeline stage when the first stage is another GPU, and nothing otherwise."""
    if m.untie_embeddings or pipeline > 1:
        return Part(sharded=padded_vocab(vocab_size, m, tensor) * m.hidden_size)
    return Part()


def parameter_count(m: ModelConfig, vocab_size: int, tensor: int = 1) -> dict[str, int]:
    """Parameters of one model replica, as `count_parameters` reports them (embedding,
    transformer, output_layer, total), with the breakdown beside them; the vocabulary padded
    for `tensor` ranks."""
    layer = layer_params(m)
    per_layer = sum(p.total for p in layer.values())
    embedding = embedding_params(m, vocab_size, tensor)
    final_norm = _norm(m).total
    counts = {
        "padded_vocab": padded_vocab(vocab_size, m, tensor),
        "word_embedding": embedding["word"].total,
        "position_embedding": embedding["position"].total,
        "embedding": embedding["word"].total + embedding["position"].total,
        "attention_per_layer": layer["attention"].total,
        "mlp_per_layer": layer["mlp"].total,
        "norms_per_layer": layer["norms"].total,
        "layer": per_layer,
        "final_norm": final_norm,
        "transformer": per_layer * m.num_layers + final_norm,
        "output_layer": output_params(m, vocab_size, tensor).total,
    }
    counts["total"] = counts["embedding"] + counts["transformer"] + counts["output_layer"]
    return counts


def stage_params(
    m: ModelConfig,
    vocab_size: int,
    tensor: int,
    pipeline: int,
    stage: int,
    split: PipelineSplit = EVEN,
) -> dict[str, int]:
    """Parameters on one GPU of a pipeline stage (one tensor-parallel rank): its share of the
    layers (fewer on the first and last stage where `split` counts the embedding or the loss as
    a layer), the embedding on the first stage, final norm and output layer on the last."""
    layers = split.layers(m.num_layers, pipeline, stage)
    transformer = sum(layer_params(m).values(), Part()) * layers
    embedding = output = Part()
    if stage == 0:
        embedding = sum(embedding_params(m, vocab_size, tensor).values(), Part())
    if stage == pipeline - 1:
        transformer = transformer + _norm(m)
        output = output_params(m, vocab_size, tensor, pipeline)
    counts = {
        "embedding": embedding.per_rank(tensor),
        "transformer": transformer.per_rank(tensor),
        "output_layer": output.per_rank(tensor),
        "linear_weights": linear_weights(m) * layers // tensor,
    }
    counts["total"] = counts["embedding"] + counts["transformer"] + counts["output_layer"]
    return counts


def count_parameters(model) -> dict[str, int]:
    """Parameters of a built model replica, with the embedding and output layer shown apart."""
    counts = {"embedding": 0, "output_layer": 0, "transformer": 0}
    for name, param in model.named_parameters():
        if name.startswith("embedding."):
            counts["embedding"] += param.numel()
        elif name.startswith("output_layer."):
            counts["output_layer"] += param.numel()
        else:
            counts["transformer"] += param.numel()
    counts["total"] = sum(counts.values())
    return counts
