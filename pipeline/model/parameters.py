"""Parameter counts of the model `gpt.build` makes, by arithmetic on its shape (no torch):
the whole replica, and one GPU's share under tensor, pipeline and expert parallelism. Tests
compare them with the megatron-core model itself.

A mixture-of-experts layer (model.moe.experts > 0) replaces the MLP by a router (a hidden x
experts weight, whole on every rank), `experts` MLPs of model.moe.ffn_hidden_size and an
optional shared expert; the first model.moe.first_dense_layers layers keep the dense MLP.
Active parameters are those one token passes through: top_k experts of each MoE layer."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ModelConfig
from pipeline.model.sizes import (
    expert_ffn_hidden_size,
    ffn_hidden_size,
    kv_channels,
    moe_layers,
    padded_vocab,
)
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
    head_dim = kv_channels(m)
    groups = m.num_query_groups or m.num_attention_heads
    qkv_width = head_dim * (m.num_attention_heads + 2 * groups)
    query_width = head_dim * m.num_attention_heads
    bias = m.add_bias_linear
    return _linear(m.hidden_size, qkv_width, bias, False) + _linear(
        query_width, m.hidden_size, bias, True
    )


def _mlp(m: ModelConfig, ffn: int) -> Part:
    fc1_width = 2 * ffn if m.activation == "swiglu" else ffn  # gate and up projections stacked
    bias = m.add_bias_linear
    return _linear(m.hidden_size, fc1_width, bias, False) + _linear(ffn, m.hidden_size, bias, True)


def mlp_params(m: ModelConfig) -> Part:
    """A dense layer's MLP."""
    return _mlp(m, ffn_hidden_size(m))


def expert_params(m: ModelConfig) -> Part:
    """One expert's MLP (sharded over the expert-tensor-parallel ranks)."""
    return _mlp(m, expert_ffn_hidden_size(m))


def shared_expert_params(m: ModelConfig) -> Part:
    width = m.moe.shared_expert_ffn_hidden_size
    return _mlp(m, width) if width else Part()


def router_params(m: ModelConfig) -> Part:
    return Part(replicated=m.hidden_size * m.moe.experts)


def _gemm_weights(m: ModelConfig, ffn: int) -> int:
    fc1_width = 2 * ffn if m.activation == "swiglu" else ffn
    return (fc1_width + ffn) * m.hidden_size


def linear_weights(m: ModelConfig) -> int:
    """Weights of a dense layer's four GEMMs, biases left out (what fp8 casts)."""
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    head_dim = kv_channels(m)
    qkv = m.hidden_size * head_dim * (heads + 2 * groups)
    return qkv + head_dim * heads * m.hidden_size + _gemm_weights(m, ffn_hidden_size(m))


def layer_params(m: ModelConfig, moe: bool = False) -> dict[str, Part]:
    """One transformer layer: attention, MLP (a MoE layer: router, every expert, shared expert),
    and its two norms (fused into the next linear by Transformer Engine; the same count)."""
    norms = {"norms": _norm(m) * 2}
    if not moe:
        return {"attention": attention_params(m), "mlp": mlp_params(m), **norms}
    return {
        "attention": attention_params(m),
        "router": router_params(m),
        "experts": expert_params(m) * m.moe.experts,
        "shared_expert": shared_expert_params(m),
        **norms,
    }


def active_layer_params(m: ModelConfig) -> int:
    """Parameters of a MoE layer one token passes through: top_k of its experts."""
    layer = layer_params(m, moe=True)
    layer["experts"] = expert_params(m) * m.moe.top_k
    return sum(p.total for p in layer.values())


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
    transformer, output_layer, total), with the breakdown beside them and, for a MoE model, the
    active parameters (those one token passes through; a dense model's are all of them); the
    vocabulary padded for `tensor` ranks."""
    layer = layer_params(m)
    per_layer = sum(p.total for p in layer.values())
    moe = moe_layers(m)
    moe_layer = sum(p.total for p in layer_params(m, moe=True).values()) if moe else 0
    active_moe_layer = active_layer_params(m) if moe else 0
    dense = m.num_layers - moe
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
        "dense_layers": dense,
        "moe_layers": moe,
        "moe_layer": moe_layer,
        "experts_per_layer": expert_params(m).total * m.moe.experts if moe else 0,
        "final_norm": final_norm,
        "transformer": per_layer * dense + moe_layer * moe + final_norm,
        "output_layer": output_params(m, vocab_size, tensor).total,
    }
    counts["total"] = counts["embedding"] + counts["transformer"] + counts["output_layer"]
    counts["active"] = counts["total"] - moe * (moe_layer - active_moe_layer)
    return counts


def layer_kinds(
    m: ModelConfig, pipeline: int, stage: int, split: PipelineSplit = EVEN
) -> tuple[int, int]:
    """(dense layers, MoE layers) on pipeline rank `stage`: the model's first
    model.moe.first_dense_layers layers are dense, the rest MoE (all dense without experts)."""
    layers = split.layers(m.num_layers, pipeline, stage)
    first = sum(split.layers(m.num_layers, pipeline, s) for s in range(stage))
    dense = max(0, min(m.num_layers - moe_layers(m), first + layers) - first)
    return dense, layers - dense


def stage_params(
    m: ModelConfig,
    vocab_size: int,
    tensor: int,
    pipeline: int,
    stage: int,
    split: PipelineSplit = EVEN,
    expert: int = 1,
    expert_tensor: int | None = None,
) -> dict[str, int]:
    """Parameters on one GPU of a pipeline stage (one tensor-parallel rank): its share of the
    layers (fewer on the first and last stage where `split` counts the embedding or the loss as
    a layer), the embedding on the first stage, final norm and output layer on the last. A MoE
    layer's experts are shared out over `expert` ranks and each split over `expert_tensor`
    (none: `tensor`) ranks; `experts` is their share, within `total`, which the distributed
    optimizer shards over the expert-data-parallel ranks instead of the data-parallel ones."""
    dense, moe = layer_kinds(m, pipeline, stage, split)
    transformer = sum(layer_params(m).values(), Part()) * dense
    experts = Part()
    if moe:
        moe_layer = layer_params(m, moe=True)
        experts = moe_layer.pop("experts") * moe
        transformer = transformer + sum(moe_layer.values(), Part()) * moe
    expert_share = experts.per_rank(expert_tensor or tensor) // expert
    embedding = output = Part()
    if stage == 0:
        embedding = sum(embedding_params(m, vocab_size, tensor).values(), Part())
    if stage == pipeline - 1:
        transformer = transformer + _norm(m)
        output = output_params(m, vocab_size, tensor, pipeline)
    expert_gemms = _gemm_weights(m, expert_ffn_hidden_size(m)) * m.moe.experts // expert
    shared = m.moe.shared_expert_ffn_hidden_size
    moe_gemms = linear_weights(m) - _gemm_weights(m, ffn_hidden_size(m))  # attention's
    moe_gemms += _gemm_weights(m, shared) if shared else 0
    counts = {
        "embedding": embedding.per_rank(tensor),
        "transformer": transformer.per_rank(tensor) + expert_share,
        "output_layer": output.per_rank(tensor),
        "experts": expert_share,
        "linear_weights": (linear_weights(m) * dense + moe_gemms * moe) // tensor
        + expert_gemms * moe // (expert_tensor or tensor),
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
