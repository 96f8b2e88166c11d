"""Sizes of the model that more than one part needs, each rule written once."""

from __future__ import annotations

from pipeline.config import ModelConfig


def padded_vocab(vocab_size: int, model: ModelConfig, tensor: int) -> int:
    """Megatron's padding: the vocabulary rounded up to a multiple of
    model.make_vocab_size_divisible_by x the tensor-parallel size, so the embedding splits
    evenly across tensor-parallel ranks."""
    multiple = model.make_vocab_size_divisible_by * tensor
    return -(-vocab_size // multiple) * multiple


def ffn_hidden_size(model: ModelConfig) -> int:
    if model.ffn_hidden_size:
        return int(model.ffn_hidden_size)
    if model.activation == "swiglu":  # 8/3 x hidden keeps the parameter count of a 4 x hidden MLP
        return int(8 * model.hidden_size / 3 + 63) // 64 * 64
    return 4 * model.hidden_size


def kv_channels(model: ModelConfig) -> int:
    """Each attention head's width: hidden / heads, as megatron-core builds the pipeline's models.
    A published shape may name its own (Qwen3-30B-A3B: 128 with hidden 2048 and 32 heads); the
    config has no such key, so only the planner's published shapes carry one."""
    return getattr(model, "kv_channels", None) or model.hidden_size // model.num_attention_heads


def moe_layers(model: ModelConfig) -> int:
    """Layers whose MLP is a mixture of experts: all but model.moe.first_dense_layers, or none
    in a dense model."""
    if not model.moe.experts:
        return 0
    return max(0, model.num_layers - model.moe.first_dense_layers)


def expert_ffn_hidden_size(model: ModelConfig) -> int:
    return int(model.moe.ffn_hidden_size or ffn_hidden_size(model))


def params_dtype(precision: str):
    """Parameter dtype for train.precision (fp8 keeps bf16 parameters; TE casts in its GEMMs)."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16}.get(precision, torch.bfloat16)
