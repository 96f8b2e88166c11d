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

A mixture of experts is stored layer by layer (`decoder.layers.N.*`: its layers are not all
alike), each layer's experts stacked on a first axis whatever the expert-parallel layout and
whether Transformer Engine's grouped GEMM or the sequential experts wrote them. Its Mixtral is
written in the layout of the Mixtral checkpoints on the Hub (`block_sparse_moe.experts.K.w1`
gate, `w3` up, `w2` down), which transformers 5 fuses on load and writes back on save.
"""

from __future__ import annotations

import torch

from pipeline.config import ModelConfig
from pipeline.model.huggingface.architectures import (
    GPT2,
    LLAMA,
    MIXTRAL,
    architecture,
    expert_ffn_hidden_size,
    head_dim,
)
from pipeline.model.moe import is_moe, moe_layer_pattern
from pipeline.model.sizes import ffn_hidden_size

Tensors = dict[str, torch.Tensor]

LAYERS = "decoder.layers."
# within a layer
QKV = "self_attention.linear_qkv."
PROJ = "self_attention.linear_proj."
FC1 = "mlp.linear_fc1."
FC2 = "mlp.linear_fc2."
ROUTER = "mlp.router.weight"
EXPERTS_FC1 = "mlp.experts.experts.linear_fc1.weight"  # [experts, 2 x width, hidden]
EXPERTS_FC2 = "mlp.experts.experts.linear_fc2.weight"  # [experts, hidden, width]
MIXTRAL_MOE = "block_sparse_moe."
WORDS = "embedding.word_embeddings.weight"
POSITIONS = "embedding.position_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm."


def checkpoint_keys(model: ModelConfig) -> list[str]:
    """The checkpoint keys that hold the weights of `model` (norm biases and linear biases as
    the model has them; a mixture of experts' router and experts where its layers have them)."""
    norms = ["layer_norm_weight"] + (
        ["layer_norm_bias"] if model.normalization == "LayerNorm" else []
    )
    linear = ["weight"] + (["bias"] if model.add_bias_linear else [])
    keys = [WORDS]
    if model.position_embedding == "learned_absolute":
        keys.append(POSITIONS)
    layer = [QKV + n for n in norms] + [FC1 + n for n in norms]
    layer += [prefix + n for prefix in (QKV, PROJ) for n in linear]
    dense = [prefix + n for prefix in (FC1, FC2) for n in linear]
    if is_moe(model):
        for i, experts in enumerate(moe_layer_pattern(model)):
            mlp = [ROUTER, EXPERTS_FC1, EXPERTS_FC2] if experts else dense
            keys += [f"{LAYERS}{i}.{name}" for name in layer + mlp]
    else:
        keys += [LAYERS + name for name in layer + dense]
    keys += [FINAL_NORM + n.removeprefix("layer_norm_") for n in norms]
    if model.untie_embeddings:
        keys.append(OUTPUT)
    return keys


def _layer(saved: Tensors, model: ModelConfig, i: int, name: str) -> torch.Tensor:
    """Layer i's tensor `name`: a mixture of experts keeps each layer's own, a dense model all
    layers' stacked."""
    return saved[f"{LAYERS}{i}.{name}"] if is_moe(model) else saved[LAYERS + name][i]


def to_hf(saved: Tensors, model: ModelConfig, vocab_size: int) -> Tensors:
    """The Hugging Face state dict of the model whose checkpoint tensors are `saved`, with
    `vocab_size` embedding rows (the tokenizer's pieces; the rest is megatron's padding)."""
    if architecture(model) in (LLAMA, MIXTRAL):
        return _llama_from_checkpoint(saved, model, vocab_size)
    return _gpt2_from_checkpoint(saved, model, vocab_size)


def from_hf(hf: Tensors, model: ModelConfig, padded_vocab: int) -> Tensors:
    """The checkpoint tensors of a Hugging Face Llama or Mixtral state dict: the inverse of
    to_hf, the embedding and output rows padded to `padded_vocab` with their mean (the usual
    start for rows no token uses yet: they neither dominate nor vanish from the softmax)."""
    m = model
    groups, heads, d = _groups(m), m.num_attention_heads, head_dim(m)
    per_group = heads // groups
    kinds = ["weight"] + (["bias"] if m.add_bias_linear else [])
    layers = []
    for i in range(m.num_layers):
        at = f"model.layers.{i}."
        layer = {
            QKV + "layer_norm_weight": hf[at + "input_layernorm.weight"],
            FC1 + "layer_norm_weight": hf[at + "post_attention_layernorm.weight"],
        }
        for kind in kinds:
            q, k, v = (hf[f"{at}self_attn.{p}_proj.{kind}"] for p in "qkv")
            rest = q.shape[1:]
            grouped = [
                q.reshape(groups, per_group * d, *rest),
                k.reshape(groups, d, *rest),
                v.reshape(groups, d, *rest),
            ]
            layer[QKV + kind] = torch.cat(grouped, dim=1).reshape(-1, *rest)
            layer[PROJ + kind] = hf[f"{at}self_attn.o_proj.{kind}"]
            if not is_moe(m):
                up = [hf[f"{at}mlp.gate_proj.{kind}"], hf[f"{at}mlp.up_proj.{kind}"]]
                layer[FC1 + kind] = torch.cat(up)
                layer[FC2 + kind] = hf[f"{at}mlp.down_proj.{kind}"]
        if is_moe(m):
            layer.update(_experts_from_hf(hf, at + MIXTRAL_MOE, m.moe.experts))
        layers.append(layer)
    if is_moe(m):
        out = {f"{LAYERS}{i}.{n}": t for i, layer in enumerate(layers) for n, t in layer.items()}
    else:
        out = {LAYERS + n: torch.stack([layer[n] for layer in layers]) for n in layers[0]}
    out[WORDS] = _pad_rows(hf["model.embed_tokens.weight"], padded_vocab)
    out[FINAL_NORM + "weight"] = hf["model.norm.weight"]
    if m.untie_embeddings:
        out[OUTPUT] = _pad_rows(hf["lm_head.weight"], padded_vocab)
    return out


def _experts_from_hf(hf: Tensors, moe: str, experts: int) -> Tensors:
    """One Mixtral layer's router and experts (`moe`: its block_sparse_moe. prefix)."""
    return {
        ROUTER: hf[moe + "gate.weight"],
        EXPERTS_FC1: torch.stack(
            [
                torch.cat([hf[f"{moe}experts.{e}.w1.weight"], hf[f"{moe}experts.{e}.w3.weight"]])
                for e in range(experts)
            ]
        ),
        EXPERTS_FC2: torch.stack([hf[f"{moe}experts.{e}.w2.weight"] for e in range(experts)]),
    }


def hf_names(model: ModelConfig) -> list[str]:
    """The tensor names of the Hugging Face Llama or Mixtral of `model` that from_hf reads."""
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight"]
    linear = ["weight"] + (["bias"] if model.add_bias_linear else [])
    for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"):
        per_layer += [f"{p}.{n}" for n in linear]
    if is_moe(model):
        per_layer.append(MIXTRAL_MOE + "gate.weight")
        per_layer += [
            f"{MIXTRAL_MOE}experts.{e}.{w}.weight"
            for e in range(model.moe.experts)
            for w in ("w1", "w2", "w3")
        ]
    else:
        per_layer += [f"mlp.{p}.{n}" for p in ("gate_proj", "up_proj", "down_proj") for n in linear]
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
    """A Llama, or a Mixtral: the same but for each layer's MLP."""
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

        def layer(name: str, i: int = i) -> torch.Tensor:
            return _layer(saved, m, i, name)

        out[at + "input_layernorm.weight"] = layer(QKV + "layer_norm_weight")
        out[at + "post_attention_layernorm.weight"] = layer(FC1 + "layer_norm_weight")
        for kind in kinds:
            qkv = layer(QKV + kind)
            grouped = qkv.reshape(groups, (per_group + 2) * d, *qkv.shape[1:])
            q, k, v = grouped.split([per_group * d, d, d], dim=1)
            out[at + f"self_attn.q_proj.{kind}"] = q.reshape(heads * d, *qkv.shape[1:])
            out[at + f"self_attn.k_proj.{kind}"] = k.reshape(groups * d, *qkv.shape[1:])
            out[at + f"self_attn.v_proj.{kind}"] = v.reshape(groups * d, *qkv.shape[1:])
            out[at + f"self_attn.o_proj.{kind}"] = layer(PROJ + kind)
            if not is_moe(m):
                gate, up = layer(FC1 + kind).split([ffn, ffn], dim=0)
                out[at + f"mlp.gate_proj.{kind}"] = gate
                out[at + f"mlp.up_proj.{kind}"] = up
                out[at + f"mlp.down_proj.{kind}"] = layer(FC2 + kind)
        if is_moe(m):
            out.update(_experts_to_hf(layer, at + MIXTRAL_MOE, expert_ffn_hidden_size(m)))
    return out


def _experts_to_hf(layer, moe: str, width: int) -> Tensors:
    """One layer's router and experts as Mixtral's (`moe`: its block_sparse_moe. prefix)."""
    out = {moe + "gate.weight": layer(ROUTER)}
    for e, (fc1, fc2) in enumerate(zip(layer(EXPERTS_FC1), layer(EXPERTS_FC2), strict=True)):
        gate, up = fc1.split([width, width], dim=0)
        out[f"{moe}experts.{e}.w1.weight"] = gate
        out[f"{moe}experts.{e}.w3.weight"] = up
        out[f"{moe}experts.{e}.w2.weight"] = fc2
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

    layers = {k.removeprefix(LAYERS): t for k, t in saved.items() if k.startswith(LAYERS)}

    def bias(key: str, i: int, size: int) -> torch.Tensor:
        if key in layers:
            return layers[key][i]
        return torch.zeros(size, dtype=saved[WORDS].dtype)

    for i in range(m.num_layers):
        at = f"transformer.h.{i}."
        out[at + "ln_1.weight"] = layers[QKV + "layer_norm_weight"][i]
        out[at + "ln_1.bias"] = layers[QKV + "layer_norm_bias"][i]
        out[at + "ln_2.weight"] = layers[FC1 + "layer_norm_weight"][i]
        out[at + "ln_2.bias"] = layers[FC1 + "layer_norm_bias"][i]
        # per head q, k, v in megatron-core; all queries, then all keys, then all values here
        qkv = layers[QKV + "weight"][i].reshape(heads, 3, d, h)
        out[at + "attn.c_attn.weight"] = qkv.transpose(0, 1).reshape(3 * h, h).t()
        out[at + "attn.c_attn.bias"] = (
            bias(QKV + "bias", i, 3 * h).reshape(heads, 3, d).transpose(0, 1).reshape(3 * h)
        )
        out[at + "attn.c_proj.weight"] = layers[PROJ + "weight"][i].t()
        out[at + "attn.c_proj.bias"] = bias(PROJ + "bias", i, h)
        out[at + "mlp.c_fc.weight"] = layers[FC1 + "weight"][i].t()
        out[at + "mlp.c_fc.bias"] = bias(FC1 + "bias", i, ffn_hidden_size(m))
        out[at + "mlp.c_proj.weight"] = layers[FC2 + "weight"][i].t()
        out[at + "mlp.c_proj.bias"] = bias(FC2 + "bias", i, h)
    return out


__all__ = ["GPT2", "LLAMA", "MIXTRAL", "checkpoint_keys", "from_hf", "hf_names", "to_hf"]
