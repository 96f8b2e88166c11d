"""Training FLOPs with Megatron-LM's formula (`num_floating_point_operations`).

Matches `num_floating_point_operations` in Megatron-LM's megatron/training/training.py for a
dense GPT (no MoE, MLA, MTP or linear attention) on unpacked [batch, seq] inputs, as of
NVIDIA/Megatron-LM main (d98e8a6) and the core_v0.16.1 tag (55ac708): every GEMM counted three
times (forward, data gradient, weight gradient) at 2 FLOPs per multiply-add; core attention
(Q K^T and softmax x V) counted over half the s x s matrix, the causal mask's non-zero part
(since Megatron-LM 8873b55, March 2025; earlier versions counted the full matrix).
"""

from __future__ import annotations

from pipeline.config import ModelConfig
from pipeline.model.sizes import ffn_hidden_size, padded_vocab


def flops_per_token(m: ModelConfig, vocab_size: int, tensor: int) -> float:
    """Forward and backward FLOPs per token of a sequence of model.seq_length tokens, the
    vocabulary padded for `tensor` tensor-parallel ranks."""
    s, h, layers = m.seq_length, m.hidden_size, m.num_layers
    heads = m.num_attention_heads
    groups = m.num_query_groups or heads
    kv_channels = h // heads
    query = kv_channels * heads  # query projection width
    key_value = kv_channels * groups  # key (and value) projection width
    passes_x_fma = 3 * 2  # forward, dgrad, wgrad; 2 FLOPs per multiply-add
    ffn_gemms = 3 if m.activation == "swiglu" else 2  # h -> 2 x ffn (gated) and ffn -> h
    mlp = h * ffn_hidden_size(m) * ffn_gemms
    projections = h * (query + 2 * key_value) + query * h  # QKV and output projection
    core_attention = query * s / 2 * 2  # causal: half the s x s matrix; Q K^T and x V
    logits = h * padded_vocab(vocab_size, m, tensor)
    return passes_x_fma * (layers * (mlp + projections + core_attention) + logits)


def flops_per_sequence(m: ModelConfig, vocab_size: int, tensor: int) -> float:
    """Forward and backward FLOPs of one sequence of model.seq_length tokens."""
    return flops_per_token(m, vocab_size, tensor) * m.seq_length
