"""Weight names and layouts: megatron-core's checkpoint keys and Hugging Face's.

The checkpoint side is what a distributed checkpoint stores, whole: one tensor per key under
its global shape, the layers of `decoder.layers.*` stacked on a first axis (the same keys under
any tensor/pipeline layout, with Transformer Engine's fused norm names). The vocabulary rows of
the embedding and output layer are megatron-core's padded count; the Hugging Face model has one
row per tokenizer piece.

Query, key and value share one matrix in megatron-core, grouped by key/value head: for each
group, its query heads, then its key head, then its value head. SwiGLU's gate and up
projections share one matrix, gate first. Rotary embeddings rotate halves of each head (no
interleaving) in both, so the query and key rows need no permutation.
"""

from __future__ import annotations

import torch

from pipeline.config import ModelConfig
from pipeline.model.huggingface.architectures import GPT2, LLAMA, architecture, head_dim
from pipeline.model.sizes import ffn_hidden_size

Tensors = dict[str, torch.Tensor]

LAYERS = "decoder.layers."
QKV = LAYERS + "self_attention.linear_qkv."
PROJ = LAYERS + "self_attention.linear_proj."
FC1 = LAYERS + "mlp.linear_fc1."
FC2 = LAYERS + "mlp.linear_fc2."
WORDS = "embedding.word_embeddings.weight"
POSITIONS = "embedding.position_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm."


def checkpoint_keys(model: ModelConfig) -> list[str]:
    """The checkpoint keys that hold the weights of `model` (norm biases and linear biases as
    the model has them)."""
    norms = ["layer_norm_weight"] + (
        ["layer_norm_bias"] if model.normalization == "LayerNorm" else []
    )
    linear = ["weight"] + (["bias"] if model.add_bias_linear else [])
    keys = [WORDS]
    if model.position_embedding == "learned_absolute":
        keys.append(POSITIONS)
    keys += [QKV + n for n in norms] + [FC1 + n for n in norms]
    keys += [prefix + n for prefix in (QKV, PROJ, FC1, FC2) for n in linear]
    keys += [FINAL_NORM + n.removeprefix("layer_norm_") for n in norms]
    if model.untie_embeddings:
        keys.append(OUTPUT)
    return keys


def to_hf(saved: Tensors, model: ModelConfig, vocab_size: int) -> Tensors:
    """The Hugging Face state dict of the model whose checkpoint tensors are `saved`, with
    `vocab_size` embedding rows (the tokenizer's pieces; the rest is megatron's padding)."""
    if architecture(model) == LLAMA:
        return _llama_from_checkpoint(saved, model, vocab_size)
    return _gpt2_from_checkpoint(saved, model, vocab_size)


def from_hf(hf: Tensors, model: ModelConfig, padded_vocab: int) -> Tensors:
    """The checkpoint tensors of a Hugging Face Llama state dict: the inverse of to_hf, the
    embedding and output rows padded to `padded_vocab` with their mean (the usual start for
    rows no token uses yet: they neither dominate nor vanish from the softmax)."""
    m, L = model, model.num_layers
    groups, heads, d = _groups(m), m.num_attention_heads, head_dim(m)
    per_group = heads // groups

    def stacked(name: str) -> torch.Tensor:
        return torch.stack([hf[f"model.layers.{i}.{name}"] for i in range(L)])

    def qkv(kind: str) -> torch.Tensor:
        q, k, v = (stacked(f"self_attn.{p}_proj.{kind}") for p in "qkv")
        rest = q.shape[2:]
        q = q.reshape(L, groups, per_group * d, *rest)
        k, v = k.reshape(L, groups, d, *rest), v.reshape(L, groups, d, *rest)
        return torch.cat([q, k, v], dim=2).reshape(L, -1, *rest)

    out = {
        WORDS: _pad_rows(hf["model.embed_tokens.weight"], padded_vocab),
        QKV + "layer_norm_weight": stacked("input_layernorm.weight"),
        QKV + "weight": qkv("weight"),
        PROJ + "weight": stacked("self_attn.o_proj.weight"),
        FC1 + "layer_norm_weight": stacked("post_attention_layernorm.weight"),
        FC1 + "weight": torch.cat(
            [stacked("mlp.gate_proj.weight"), stacked("mlp.up_proj.weight")], dim=1
        ),
        FC2 + "weight": stacked("mlp.down_proj.weight"),
        FINAL_NORM + "weight": hf["model.norm.weight"],
    }
    if m.add_bias_linear:
        out[QKV + "bias"] = qkv("bias")
        out[PROJ + "bias"] = stacked("self_attn.o_proj.bias")
        out[FC1 + "bias"] = torch.cat(
            [stacked("mlp.gate_proj.bias"), stacked("mlp.up_proj.bias")], dim=1
        )
        out[FC2 + "bias"] = stacked("mlp.down_proj.bias")
    if m.untie_embeddings:
        out[OUTPUT] = _pad_rows(hf["lm_head.weight"], padded_vocab)
    return out


def hf_names(model: ModelConfig) -> list[str]:
    """The tensor names of the Hugging Face Llama of `model` that from_hf reads."""
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight"]
    linear = ["weight"] + (["bias"] if model.add_bias_linear else [])
    for p in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ):
        per_layer += [f"{p}.{n}" for n in linear]
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [f"model.layers.{i}.{n}" for i in range(model.num_layers) for n in per_layer]
    if model.untie_embeddings:
        names.append("lm_head.weight")
    return names


def _groups(model: ModelConfig) -> int:
    return model.num_query_groups or model.num_attention_heads


def _pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.shape[0] > rows:
        raise ValueError(f"{weight.shape[0]} vocabulary rows do not fit in {rows}")
    extra = weight.mean(dim=0, keepdim=True).expand(rows - weight.shape[0], -1)
    return torch.cat([weight, extra.to(weight.dtype)])


def _llama_from_checkpoint(saved: Tensors, m: ModelConfig, vocab: int) -> Tensors:
    groups, heads, d = _groups(m), m.num_attention_heads, head_dim(m)
    per_group, ffn = heads // groups, ffn_hidden_size(m)
    out = {
        "model.embed_tokens.weight": saved[WORDS][:vocab],
        "model.norm.weight": saved[FINAL_NORM + "weight"],
    }
    if m.untie_embeddings:
        out["lm_head.weight"] = saved[OUTPUT][:vocab]
    kinds = ["weight"] + (["bias"] if m.add_bias_linear else [])
    for i in range(m.num_layers):
        at = f"model.layers.{i}."
        out[at + "input_layernorm.weight"] = saved[QKV + "layer_norm_weight"][i]
        out[at + "post_attention_layernorm.weight"] = saved[FC1 + "layer_norm_weight"][i]
        for kind in kinds:
            qkv = saved[QKV + kind][i]
            grouped = qkv.reshape(groups, (per_group + 2) * d, *qkv.shape[1:])
            q, k, v = grouped.split([per_group * d, d, d], dim=1)
            out[at + f"self_attn.q_proj.{kind}"] = q.reshape(heads * d, *qkv.shape[1:])
            out[at + f"self_attn.k_proj.{kind}"] = k.reshape(groups * d, *qkv.shape[1:])
            out[at + f"self_attn.v_proj.{kind}"] = v.reshape(groups * d, *qkv.shape[1:])
            out[at + f"self_attn.o_proj.{kind}"] = saved[PROJ + kind][i]
            gate, up = saved[FC1 + kind][i].split([ffn, ffn], dim=0)
            out[at + f"mlp.gate_proj.{kind}"] = gate
            out[at + f"mlp.up_proj.{kind}"] = up
            out[at + f"mlp.down_proj.{kind}"] = saved[FC2 + kind][i]
    return out


def _gpt2_from_checkpoint(saved: Tensors, m: ModelConfig, vocab: int) -> Tensors:
    """GPT-2's linear layers are Conv1D, weights stored [in, out]: transposed here. A model
    trained without linear biases gets zero ones, which compute the same."""
    heads, d, h = m.num_attention_heads, head_dim(m), m.hidden_size
    out = {
        "transformer.wte.weight": saved[WORDS][:vocab],
        "transformer.wpe.weight": saved[POSITIONS],
        "transformer.ln_f.weight": saved[FINAL_NORM + "weight"],
        "transformer.ln_f.bias": saved[FINAL_NORM + "bias"],
    }
    if m.untie_embeddings:
        out["lm_head.weight"] = saved[OUTPUT][:vocab]

    def bias(key: str, i: int, size: int) -> torch.Tensor:
        if key in saved:
            return saved[key][i]
        return torch.zeros(size, dtype=saved[WORDS].dtype)

    for i in range(m.num_layers):
        at = f"transformer.h.{i}."
        out[at + "ln_1.weight"] = saved[QKV + "layer_norm_weight"][i]
        out[at + "ln_1.bias"] = saved[QKV + "layer_norm_bias"][i]
        out[at + "ln_2.weight"] = saved[FC1 + "layer_norm_weight"][i]
        out[at + "ln_2.bias"] = saved[FC1 + "layer_norm_bias"][i]
        # per head q, k, v in megatron-core; all queries, then all keys, then all values here
        qkv = saved[QKV + "weight"][i].reshape(heads, 3, d, h)
        out[at + "attn.c_attn.weight"] = qkv.transpose(0, 1).reshape(3 * h, h).t()
        out[at + "attn.c_attn.bias"] = (
            bias(QKV + "bias", i, 3 * h).reshape(heads, 3, d).transpose(0, 1).reshape(3 * h)
        )
        out[at + "attn.c_proj.weight"] = saved[PROJ + "weight"][i].t()
        out[at + "attn.c_proj.bias"] = bias(PROJ + "bias", i, h)
        out[at + "mlp.c_fc.weight"] = saved[FC1 + "weight"][i].t()
        out[at + "mlp.c_fc.bias"] = bias(FC1 + "bias", i, ffn_hidden_size(m))
        out[at + "mlp.c_proj.weight"] = saved[FC2 + "weight"][i].t()
        out[at + "mlp.c_proj.bias"] = bias(FC2 + "bias", i, h)
    return out


__all__ = ["GPT2", "LLAMA", "checkpoint_keys", "from_hf", "hf_names", "to_hf"]
