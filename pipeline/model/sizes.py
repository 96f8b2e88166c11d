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


def params_dtype(precision: str):
    """Parameter dtype for train.precision (fp8 keeps bf16 parameters; TE casts in its GEMMs)."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16}.get(precision, torch.bfloat16)
